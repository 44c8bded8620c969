"""``applier run --until-lsn LSN`` / ``--until-caught-up``: apply up to a position, then stop.

The rule
========

A source transaction is applied iff its commit record *ends* at or before
the position: ``end_lsn <= LSN``. That is the same comparison the worker
makes against the origin's progress ("Restart and idempotence" in
:mod:`applier.apply.worker`), so after a run until LSN the origin's progress
is the ``end_lsn`` of the last transaction applied, and a later run (until a
later LSN, or for good) continues from exactly there. ``--until-caught-up``
reads the source's ``pg_current_wal_lsn()`` when the command starts and uses
it as LSN: every transaction committed before the command started is applied.

What each message says about the rule, before it is dispatched:

* Begin carries ``final_lsn``, the commit record's *start*: ``final_lsn >=
  LSN`` means ``end_lsn > LSN``, so it is not applied and nothing after it
  will be (the walsender sends transactions in commit order): stop. Below LSN
  the transaction is applied unless LSN lies inside its commit record, which
  only its Commit tells (``end_lsn``); then it is rolled back and the worker
  stops.
* Begin Prepare carries the prepare's ``end_lsn``; Stream Commit, Stream
  Prepare, Commit Prepared carry theirs; Rollback Prepared its
  ``rollback_end_lsn``: past LSN, stop before it.
* Two-phase: a transaction whose PREPARE ends at or before LSN and whose
  COMMIT PREPARED ends after it is *prepared* on the target and left so, as
  it was on the source at LSN (invisible until committed). A later run
  commits it. ``applier cutover`` reports such prepared transactions: finish
  them on the source before the cutover.
* Streamed transactions are spooled as usual; one whose Stream Commit ends
  past LSN is never replayed (its spool is dropped when the worker stops).

Group commit: a transaction only joins an open group when its Commit is in
the same batch and ends at or before LSN; otherwise the group is committed
first, so a transaction rolled back at its Commit (LSN inside its commit
record) never takes earlier ones with it.

When to stop
============

The worker stops once it knows nothing more at or before LSN can come: a
message past LSN arrived (above), or, with nothing in hand (between
transactions), the stream's received position (``wal_end`` of the last
XLogData or keepalive, :attr:`LogicalStream.last_received`) is at or past
LSN: the walsender decodes WAL in order and sends every transaction at its
commit, so when it has read up to LSN every commit before LSN was sent. An
idle source is detected by the keepalive the walsender sends once it has
read everything (when our reported write position is behind its own). Before
it stops, the worker waits until every applied commit is flushed on the
target and confirmed.

What is confirmed to the slot: the end of the last applied transaction, and
while idle the received position, but never past LSN (or past the commit
record's start of a transaction cut at its Commit): the slot must not move
past a transaction the target does not have, since a restart streams from
``max(origin, confirmed_flush_lsn)``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Protocol

import psycopg

from applier import pgconn
from applier.apply.core.states import IDLE, State
from applier.config import Config
from applier.errors import SourceError
from applier.lsn import Lsn
from applier.protocol import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    PgOutputMessage,
    RollbackPrepared,
    StreamCommit,
    StreamPrepare,
)

log = logging.getLogger("applier.apply")

Item = tuple[Lsn, PgOutputMessage]


class _Session(Protocol):
    @property
    def in_txn(self) -> bool: ...


class _Flush(Protocol):
    @property
    def pending(self) -> object: ...


class UntilHost(Protocol):
    """What the stop rule reads and asks of the Applier."""

    @property
    def txn(self) -> object | None: ...
    @property
    def state(self) -> State: ...
    @property
    def group_txns(self) -> int: ...
    @property
    def session(self) -> _Session: ...
    @property
    def flush(self) -> _Flush: ...
    @property
    def last_commit_lsn(self) -> Lsn | None: ...

    def commit_group(self) -> None: ...
    def abandon(self) -> None: ...


class UntilStream(Protocol):
    """What the stop rule reads of the stream."""

    @property
    def last_received(self) -> Lsn: ...
    @property
    def confirmed(self) -> Lsn: ...


def _finish(msg: object) -> tuple[Lsn | None, Lsn] | None:
    """(start, end) of the record that finishes what ``msg`` announces, if it says so."""
    if isinstance(msg, (Commit, StreamCommit, CommitPrepared)):
        return msg.commit_lsn, msg.end_lsn
    if isinstance(msg, (BeginPrepare, StreamPrepare)):
        return msg.prepare_lsn, msg.end_lsn
    if isinstance(msg, RollbackPrepared):
        return None, msg.rollback_end_lsn
    return None


class Until:
    """The stop rule of a worker that applies up to ``lsn`` (see the module docstring)."""

    def __init__(self, lsn: Lsn) -> None:
        self.lsn = lsn
        #: A message past the position arrived: nothing more is dispatched.
        self.reached = False
        #: The highest source position that may be confirmed while idle.
        self.cap = lsn
        #: What stopped the worker, for its log line.
        self.why = ""
        #: Everything at or before the position is applied and confirmed.
        self.done = False

    def admit(self, batch: list[Item], applier: UntilHost | None) -> Iterator[Item]:
        """The messages of ``batch`` to dispatch, in order; lazily, so that the open
        group can be committed between two of them."""
        assert applier is not None  # the worker admits only while an Applier runs
        for i, (lsn, msg) in enumerate(batch):
            if self.reached:
                return
            if isinstance(msg, Begin):
                if msg.final_lsn >= self.lsn:
                    self._stop(applier, self.lsn, f"a transaction commits at {msg.final_lsn}")
                    return
                if applier.group_txns and not self._commit_within(batch, i + 1):
                    applier.commit_group()  # it may be rolled back at its Commit: alone
            else:
                bounds = _finish(msg)
                if bounds is not None and bounds[1] > self.lsn:
                    start, end = bounds
                    cap = Lsn(0) if start is None else Lsn(min(self.lsn, start))
                    self._stop(applier, cap, f"a transaction ends at {end}")
                    return
            yield lsn, msg

    def _commit_within(self, batch: list[Item], start: int) -> bool:
        """The Commit of the transaction begun before ``start`` is in the batch, <= LSN."""
        for _, msg in batch[start:]:
            if isinstance(msg, Commit):
                return msg.end_lsn <= self.lsn
        return False

    def _stop(self, applier: UntilHost, cap: Lsn, why: str) -> None:
        self.reached = True
        self.cap = Lsn(min(self.cap, cap))
        self.why = why
        if applier.txn is None:
            applier.commit_group()  # what it holds ends at or before LSN
        else:
            # Cut at its Commit (LSN inside its commit record): it is alone in the
            # target transaction (see admit), so only it is rolled back.
            applier.abandon()

    def confirmable(self, received: Lsn) -> Lsn:
        """The received position, capped: the idle position the worker may confirm."""
        return Lsn(min(received, self.cap))

    def finished(self, stream: UntilStream, applier: UntilHost) -> bool:
        """Nothing at or before LSN can come any more, and what was applied is confirmed."""
        idle = applier.txn is None and applier.state is IDLE and not applier.session.in_txn
        if self.reached:
            done = not applier.group_txns and not applier.flush.pending
        else:
            passed = stream.last_received >= self.lsn
            done = idle and passed and not applier.flush.pending
            if done:
                self.why = f"the stream passed {self.lsn} ({stream.last_received})"
        if done:
            self.done = True
            log.info(
                "applied everything up to the position; stopping",
                extra={
                    "ctx": {
                        "until": self.lsn,
                        "why": self.why,
                        "last_applied": applier.last_commit_lsn,
                        "confirmed": stream.confirmed,
                    }
                },
            )
        return bool(done)


def current_wal_lsn(cfg: Config) -> Lsn:
    """The source's ``pg_current_wal_lsn()`` now (``run --until-caught-up``, cutover)."""
    conninfo = cfg.source.conninfo()
    try:
        with pgconn.connect(conninfo, side="source", purpose="applier", connect_timeout=30) as conn:
            row = conn.execute("SELECT pg_catalog.pg_current_wal_lsn()::text").fetchone()
    except psycopg.Error as e:
        raise SourceError(
            f"cannot read the source's WAL position: {str(e).strip()}",
            hint="check [source] dsn and that the server is up",
        ) from None
    assert row is not None
    return Lsn.parse(str(row[0]))
