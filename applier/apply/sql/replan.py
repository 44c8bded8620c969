"""After a failure: how the next session applies what failed (or that it stops).

The worker restarts a session from the origin after an apply error whenever a
second pass can do better than stopping; this module decides how, and keeps
the positions and xids that say so across sessions (see the worker's "Faults"
and the handlers' "Group commit"):

* a change a skip rule or conflict policy may take: replay carefully (a
  savepoint per change, :mod:`applier.apply.rules.resolve`) up to the position
  received, and one by one;
* a failure inside a group, a merged or multi-row statement, or a pipelined
  commit, whose context may name the wrong transaction: one by one up to the
  position received, so the failing one fails alone and is named;
* a failure while a streamed transaction was applied as it arrived: that xid
  is never applied live again; it is spooled and replayed at its commit,
  where the error names its own commit LSN (:mod:`applier.apply.handlers.streamed`);
* anything else stops the worker with the error.
"""

from __future__ import annotations

import logging
from typing import Protocol

from applier.errors import ApplierError, ApplyError
from applier.lsn import Lsn

log = logging.getLogger("applier.apply")


class _Live(Protocol):
    @property
    def xid(self) -> int: ...


class _Streamed(Protocol):
    @property
    def live_failed(self) -> int | None: ...


class _Resolver(Protocol):
    def catchable(self, e: ApplyError) -> bool: ...
    def explain_failure(self, e: ApplyError) -> None: ...


class FailedEngine(Protocol):
    """What :meth:`Replan.after_error` reads of the Applier that failed."""

    @property
    def live(self) -> _Live | None: ...
    @property
    def streamed(self) -> _Streamed: ...
    @property
    def resolver(self) -> _Resolver: ...
    @property
    def careful(self) -> bool: ...
    @property
    def group_txns(self) -> int: ...


class FailedSession(Protocol):
    """... and of its target session."""

    @property
    def failed_inflight(self) -> bool: ...


class Replan:
    """What the next sessions apply one by one, carefully, or not live."""

    def __init__(self) -> None:
        #: After a failed group: apply one by one up to this source position.
        self.no_group_until = Lsn(0)
        #: After a failure a rule or policy may take: replay carefully up to here.
        self.careful_until = Lsn(0)
        #: Streamed transactions never applied live again.
        self.no_live: set[int] = set()

    def restream(self, xid: int, why: str) -> None:
        """A live transaction whose spool was forgotten must come again, spooled."""
        self.no_live.add(xid)
        log.info(
            "restreaming a streamed transaction to spool it: %s", why, extra={"ctx": {"xid": xid}}
        )

    def after_error(
        self, e: ApplierError, applier: FailedEngine, session: FailedSession, received: Lsn
    ) -> bool:
        """True: start over from the origin as recorded here; False: stop with ``e``."""
        live = applier.live.xid if applier.live is not None else applier.streamed.live_failed
        if live is not None:
            self.no_live.add(live)
        if isinstance(e, ApplyError) and not applier.careful and applier.resolver.catchable(e):
            self.careful_until = Lsn(max(received, self.careful_until))
            self.no_group_until = Lsn(max(self.careful_until, self.no_group_until))
            log.warning(
                "a change failed that a skip rule or conflict policy may take; "
                "replaying with a savepoint per change: %s",
                e,
                extra={"ctx": {"until": self.careful_until}},
            )
            return True
        merged = "merged_changes" in e.context
        if not applier.group_txns and not session.failed_inflight and not merged and live is None:
            if isinstance(e, ApplyError):
                applier.resolver.explain_failure(e)
            return False
        # Some earlier transaction of the open group may be the culprit, and the
        # error's context may name the wrong one: roll back, restream from the origin
        # and apply one by one up to here.
        self.no_group_until = Lsn(max(received, self.no_group_until))
        log.warning(
            "a group of transactions failed; applying them one by one: %s",
            e,
            extra={"ctx": {"txns": applier.group_txns + 1, "until": self.no_group_until}},
        )
        return True
