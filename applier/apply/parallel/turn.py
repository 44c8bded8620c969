"""The commit turn: N apply sessions commit in source order, one after another.

Each transaction gets a sequence number at Begin (1, 2, 3, ... in source
commit order). A session applies its transaction's statements as soon as the
:class:`~.schedule.Schedule` lets it, then waits here for its turn: COMMIT is
sent only once the predecessor's COMMIT has *returned* (:mod:`.member` commits
through its Applier once its turn came).
That is the order :mod:`.origins` proves exactly-once from: the committed
transactions are always a prefix of the source's order, and the restart point is
the largest progress of the group. The stamp stays inside COMMIT
(:meth:`~applier.apply.target.session.TargetSession.commit`), so a session
lost before its COMMIT reached the server leaves its origin alone.

A transaction whose COMMIT fails, or whose session is lost, *breaks* the turn:
no later transaction may commit (whether the failed one committed cannot be
told from a lost connection, and need not be: the restart point says it).
Every waiter, present and future, gets :class:`TurnBroken` instead; its
session rolls back (origin untouched) and the leader restarts from
:func:`~.origins.restart_point`.
"""

from __future__ import annotations

import threading

from applier.errors import TransientError


class TurnBroken(TransientError):
    """An earlier transaction did not commit: this one must not (restart from the group)."""


class CommitTurn:
    """Whose turn it is to COMMIT, shared by the sessions' threads."""

    def __init__(self, committed: int = 0) -> None:
        #: The sequence number of the last transaction whose COMMIT returned.
        self.committed = committed
        self._broken: str | None = None
        self._cond = threading.Condition()

    def wait(self, seq: int, timeout: float | None = None) -> bool:
        """Block until transaction ``seq`` may commit (``seq - 1`` committed); False on
        ``timeout`` (the pool's deadlock watch looks then). :class:`TurnBroken` when an
        earlier one failed."""
        if seq <= self.committed:
            raise ValueError(f"transaction {seq} waits for a turn already past ({self.committed})")
        with self._cond:
            ready = self._cond.wait_for(
                lambda: self._broken is not None or self.committed == seq - 1, timeout
            )
            if self._broken is not None:
                raise TurnBroken(f"transaction {seq} not committed: {self._broken}")
            return ready

    def done(self, seq: int) -> None:
        """Transaction ``seq``'s COMMIT returned: the next one's turn. Also after the
        turn broke: a COMMIT sent in turn may return after a later session failed, and
        it committed all the same (the break holds every later one back)."""
        with self._cond:
            if seq != self.committed + 1:
                raise AssertionError(f"commit {seq} out of turn (after {self.committed})")
            self.committed = seq
            self._cond.notify_all()

    def broken(self, why: str) -> None:
        """No later transaction may commit (see the module's docstring)."""
        with self._cond:
            if self._broken is None:
                self._broken = why
            self._cond.notify_all()

    @property
    def is_broken(self) -> bool:
        return self._broken is not None
