"""Lag: the one definition behind the log, ``STATUS=``, ``status``, metrics and cutover.

What lag means
==============

As PostgreSQL's ``pg_stat_replication`` counts it for a standby, in two units:

* **bytes**: the source's current WAL position minus the position up to which
  the worker is *done*, never negative. Done means: every source transaction
  that ends there or before is applied on the target (the replication
  origin's progress), or had nothing for us (another database's WAL, a
  checkpoint, a transaction of tables we do not apply: the position the
  worker confirms to the slot once nothing is in hand, see
  :mod:`applier.apply.confirm`). The source's position is
  ``pg_current_wal_lsn()`` where a command asks the source (``status``,
  ``cutover``, the metrics' probe), and the walsender's last reported WAL end
  (XLogData and keepalives) inside the worker.
* **seconds**: how long ago the oldest source transaction that is *pending*
  was committed (its commit timestamp, or a prepare's time with two-phase);
  **0 when nothing is pending**. Pending means the worker has received its
  commit (Begin, Stream Commit, Begin Prepare, Stream Prepare, Commit or
  Rollback Prepared carry the time) and has not yet finished it on the
  target.

So an idle, caught-up replica shows 0 s whatever the age of its last
transaction, and WAL that moves on an idle source (other databases,
checkpoints) is never counted as pending work: it is bytes until the worker
confirms it (at most ``[apply] status_interval``), never seconds. An apply
that is blocked (a lock on the target) shows seconds that grow from the
blocked transaction's commit, as long as it stays blocked.

Differences from PostgreSQL's ``replay_lag``, which is measured on the source
when a standby's reply arrives: ours grows while the apply is stuck
(``replay_lag`` keeps its last value until the next reply), and it is 0 when
nothing is pending (``replay_lag`` becomes NULL after a while). A transaction
the walsender has not sent yet (still decoding a large one) is not pending
until its commit arrives: the bytes show it first. The seconds compare the
source's commit timestamp with a clock: the source's own (``status`` and
``cutover`` read ``clock_timestamp()`` there) or the worker host's (the log,
``STATUS=``, metrics), so clock skew between the source and the worker's host
adds to the latter; keep the clocks synchronised (NTP).

Where it is computed
====================

Inside the worker, :class:`PendingCommits` keeps the received-but-unfinished
commits (the apply handlers note each one) and :func:`measure` turns them and
the positions into a :class:`Lag`. A thread of the worker writes it every
``status_interval`` into ``applier.worker_status`` (``lag_at``,
``pending_since``), logs it and tells systemd (:mod:`applier.apply.beat`), so
it keeps being told while the apply loop is blocked. ``applier status`` reads
the source and that row and calls :func:`measure` too (:mod:`applier.status.report`);
``cutover`` reports what ``status`` says at its start. Without a running
worker the seconds cannot be known (no one has received the commits): they
are None, with :data:`NOT_RUNNING` saying why, while the bytes still are.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import deque
from dataclasses import dataclass

from psycopg import sql

from .lsn import Lsn, pg_timestamp

#: The source's current WAL position in SQL (a standby source: what it replayed).
SOURCE_WAL_LSN = sql.SQL(
    "CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() "
    "ELSE pg_catalog.pg_current_wal_lsn() END"
)

#: Why the seconds are None when no worker reports them.
NOT_RUNNING = "seconds unknown: no worker running to measure them"


@dataclass(frozen=True, slots=True)
class Lag:
    """Lag in bytes and in seconds; None where it cannot be known (``note`` says why)."""

    bytes: int | None
    seconds: float | None
    note: str | None = None

    def describe(self) -> str:
        """``"0 B, 0.0 s"``: how the log, ``STATUS=`` and ``status`` print it."""
        secs = "-" if self.seconds is None else f"{self.seconds:.1f} s"
        text = f"{format_bytes(self.bytes)}, {secs}"
        return f"{text} ({self.note})" if self.note else text


def measure(
    source: Lsn | None,
    done: Lsn | None,
    pending_since: dt.datetime | None,
    now: dt.datetime,
) -> Lag:
    """The lag, from the source's WAL position, the position the worker is done up to,
    and the commit time of the oldest pending transaction (None: nothing is pending)."""
    nbytes = None if source is None or done is None else max(0, int(source) - int(done))
    if pending_since is None or nbytes == 0:
        # Nothing pending, or everything up to the source's position done: whatever
        # the worker last said, nothing can be waiting.
        return Lag(nbytes, 0.0)
    return Lag(nbytes, max(0.0, (now - pending_since).total_seconds()))


def not_running(source: Lsn | None, done: Lsn | None) -> Lag:
    """The lag without a worker to tell the seconds: 0 s only if nothing is left."""
    nbytes = None if source is None or done is None else max(0, int(source) - int(done))
    if nbytes == 0:
        return Lag(0, 0.0)
    return Lag(nbytes, None, NOT_RUNNING)


class PendingCommits:
    """Source commits the worker received and has not finished yet, oldest first.

    The apply thread appends (:meth:`received`, per transaction); any thread may
    ask for the oldest (:meth:`oldest`), which first drops what the done position
    passed. ``deque.append``/``popleft`` are atomic; the lock only keeps two readers
    from dropping the same entry twice. It outlives the worker's sessions: after a
    reconnect the walsender resends what was pending, and that is not new.
    """

    def __init__(self) -> None:
        #: (position, commit timestamp in the protocol's microseconds): finished once
        #: the done position is past ``position``.
        self._q: deque[tuple[Lsn, int]] = deque()
        self._lock = threading.Lock()

    def received(self, position: Lsn, commit_ts: int) -> None:
        """A commit arrived; it is finished once the done position is > ``position``
        (the start of its commit record: a done position is always a record's end)."""
        q = self._q
        if q and q[-1][0] >= position:
            return  # resent after a reconnect, or noted already
        q.append((position, commit_ts))

    def oldest(self, done: Lsn) -> dt.datetime | None:
        """The commit time of the oldest commit not finished at ``done``; None if none."""
        with self._lock:
            self._drop(done)
            q = self._q
            return pg_timestamp(q[0][1]) if q else None

    def drop(self, done: Lsn) -> None:
        """Forget what ``done`` passed (the apply loop, so that a backlog's entries do
        not wait for the next report)."""
        with self._lock:
            self._drop(done)

    def _drop(self, done: Lsn) -> None:
        q = self._q
        while q and q[0][0] < done:
            q.popleft()

    def __len__(self) -> int:
        return len(self._q)


def format_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(size) < 1024:
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"
