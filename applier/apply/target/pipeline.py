"""The pq-level pipeline under the apply session: sending, and reading results.

Executor
========

Rows go through libpq's pipeline mode at the pq level: the connection is
non-blocking, each change is one ``send_query_prepared`` with the protocol's
bytes as parameter values and their text/binary formats, and nothing waits for
the server until the commit's Sync. Results are read as they arrive (whenever
we send, and whenever the socket is full), matched against a queue of what was
sent (:attr:`Pipeline._q`, one item per expected result), so an error or an
UPDATE/DELETE that hit no row is attributed to its change (LSN, table, key)
without a round trip per row. The queue is bounded so a huge transaction
cannot run away with memory when the target is slower than the stream.

The first error is kept (:attr:`Pipeline.failure`, with the context of the
item that failed) and raised by :meth:`Pipeline.raise_failure` as an
:class:`ApplyError`, or a :class:`ConnectionLost` for the SQLSTATEs that mean
"the connection is gone, not the change is bad".

Waiting
=======

Every wait for the socket is bounded by the connection's
:class:`~applier.apply.target.connection.Watchdog` (``[apply] target_timeout``): while
results are owed and the socket stays silent that long, the watchdog asks the
server (on a fresh connection) whether our backend is still executing, and if
not (or if the server cannot be reached) shuts the socket down, so the wait
ends with a :class:`ConnectionLost` and the worker reconnects.
"""

from __future__ import annotations

import selectors
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

from applier.apply.sql.planner import Params
from applier.apply.target.connection import Watchdog
from applier.errors import ApplierError, ApplyError, ConnectionLost
from applier.lsn import Lsn
from applier.stream.readahead import ReadAhead

# Queue item kinds. _CHECK: a statement that reports a conflict in its result rows
# (applier.apply.rules.conflicts); its context's ``check(ctx, result)`` reads them.
_CTL, _ROW, _MOD, _LSN, _SYNC, _MANY, _CHECK = range(7)
#: Kinds whose results may report a conflict the commit must wait for (counted in
#: Pipeline._checks): a policy may fail the transaction on them.
_CHECKS = frozenset({_MOD, _MANY, _CHECK})
#: _MOD and _MANY of a table without a [conflicts] policy: a row not found is only
#: recorded, so the commit does not wait for them (see applier.apply.rules.conflictlog,
#: "Records").
_MOD_LAZY, _MANY_LAZY = 7, 8

#: Send this many statements between non-blocking result reads.
PUMP_EVERY = 256
#: Block when this many statements (a merged one counts its rows) await their results.
MAX_INFLIGHT = 20_000
#: ... or when this many bytes of parameter values were sent since the queue was
#: last emptied: each change awaiting its result holds its row, so wide rows must
#: not fill the queue by count (20,000 rows of 1 MB each).
MAX_INFLIGHT_BYTES = 32 * 1024 * 1024

#: The selector key data of the stream's socket while it is read ahead.
_AHEAD = "read ahead"

#: SQLSTATE classes/codes that mean "the connection is gone", not "the change is bad".
TRANSIENT_SQLSTATES = ("08", "57P01", "57P02", "57P03", "55006", "40P01", "40001", "53300")

ExecStatus = pq.ExecStatus


def is_transient_sqlstate(state: str | None) -> bool:
    return bool(state) and any(state.startswith(p) for p in TRANSIENT_SQLSTATES)  # type: ignore[union-attr]


def error_fields(res: pq.abc.PGresult) -> tuple[str | None, str]:
    """The SQLSTATE and the primary message of a failed result."""
    state_b = res.error_field(pq.DiagnosticField.SQLSTATE)
    msg_b = res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or res.error_message
    return (state_b.decode() if state_b else None), msg_b.decode("utf-8", "replace").strip()


def lost(e: BaseException, what: str = "target") -> ConnectionLost:
    detail = str(e).strip().replace("\n", " ")
    return ConnectionLost(
        f"lost the connection to the {what}: {detail}",
        hint="applier run reconnects and resumes from the origin's progress",
    )


class Pipeline:
    """A connection in pipeline mode and the queue of results it owes."""

    def __init__(self, conn: psycopg.Connection[Any], watchdog: Watchdog) -> None:
        self.conn = conn
        self.pg = conn.pgconn
        self.watchdog = watchdog
        self._q: deque[tuple[int, Any]] = deque()
        self._sent = 0
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.pg.socket, selectors.EVENT_READ)
        self._pipeline = False
        self.failure: tuple[pq.abc.PGresult, Any] | None = None
        #: The failure was found while earlier commits were in flight: its context may
        #: name a later transaction than the one that failed.
        self.failed_inflight = False
        #: The guard id of the last transaction known to have committed (set by the
        #: commit's Sync), and the target position of the last commit (``_LSN``).
        self._guard_committed: bytes | None = None
        self.committed = Lsn(0)
        self._local_lsn = Lsn(0)
        #: The target's WAL flush position as the last commit's result saw it: the
        #: confirmer releases commits with it, without a round trip of its own.
        self.flushed_seen = Lsn(0)
        #: Context added to every error (lsn, xid) by the worker.
        self.txn_context: dict[str, Any] = {}
        #: Statements whose Parse the server has, or will have (it is queued); one
        #: whose Parse the server skipped or refused is taken out again (see _drain).
        self._prepared: set[bytes] = set()
        #: Called with the context of an UPDATE/DELETE that found no row.
        self.on_missing: Callable[[Any], None] = lambda ctx: None
        #: Results not read yet that may report a conflict (see read_checks).
        self._checks = 0
        #: Statements awaiting their results at most (a parallel leader's session
        #: takes fewer: applier.apply.parallel.leader, "the inline lane").
        self.max_inflight = MAX_INFLIGHT
        #: Rows of merged statements in flight beyond one each: what bounds memory
        #: is the changes held for their results, not the statements.
        self._held_rows = 0
        #: Bytes of parameter values sent since the queue was last emptied (an upper
        #: bound of what the changes in flight hold; see MAX_INFLIGHT_BYTES).
        self._bytes_out = 0
        #: The stream to read ahead while waiting (applier.stream.readahead): what
        #: says whether there is room, its socket, and what takes the data.
        self.read_ahead: tuple[ReadAhead, int, Callable[[], bool]] | None = None

    def _error(self, e: psycopg.Error, where: str) -> ApplierError:
        state = e.sqlstate
        if (isinstance(e, psycopg.OperationalError) and state is None) or is_transient_sqlstate(
            state
        ):
            return ConnectionLost(f"{where}: {str(e).strip()}", sqlstate=state)
        return ApplyError(f"{where}: {str(e).strip()}", sqlstate=state)

    # -- pipeline ----------------------------------------------------------------------

    def _send_ctl(self, query: bytes, what: str, params: Params | None = None) -> None:
        self.pg.send_query_params(query, params, result_format=0)
        self._q.append((_CTL, what))
        self._after_send()

    def collect(self, first: pq.abc.PGresult | None) -> pq.abc.PGresult | None:
        """Read results until libpq has no more; return the first error."""
        error = first if first is not None and first.status == ExecStatus.FATAL_ERROR else None
        while (res := self.next_result()) is not None:
            if error is None and res.status == ExecStatus.FATAL_ERROR:
                error = res
        return error

    def next_result(self) -> pq.abc.PGresult | None:
        pg = self.pg
        while True:
            pending = pg.flush()
            pg.consume_input()
            if not pg.is_busy():
                return pg.get_result()
            self.wait_socket(write=bool(pending))

    def wait_socket(self, write: bool) -> None:
        pg = self.pg
        for _key, events in self._select(write):
            if events & selectors.EVENT_READ:
                pg.consume_input()  # notices, or the error that ends the COPY

    def _select(self, write: bool) -> list[tuple[selectors.SelectorKey, int]]:
        """Wait until the socket can be read (or written); a socket silent for
        ``target_timeout`` is checked by the watchdog, which raises if it stalled.

        Meanwhile the stream is read ahead (:attr:`read_ahead`) when it is due and
        its socket readable: the walsender goes on while we wait.
        """
        sel = self._sel
        sel.modify(self.pg.socket, selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0))
        ahead = self.read_ahead
        watching = False
        try:
            start = time.monotonic()
            deadline = start + self.watchdog.timeout
            while True:
                now = time.monotonic()
                wake = deadline
                if ahead is not None and not watching and ahead[0].room:
                    if now >= ahead[0].next_fill:
                        watching = self._watch(ahead)
                    else:
                        wake = min(deadline, ahead[0].next_fill)  # due then
                ready = sel.select(max(wake - now, 0.0))
                ours = [kev for kev in ready if kev[0].data is not _AHEAD]
                if ours:
                    return ours
                if ready:  # only the stream: take what it sent, then wait on
                    assert ahead is not None
                    ahead[2]()
                    sel.unregister(ahead[1])
                    watching = False
                now = time.monotonic()
                if now >= deadline:
                    self.watchdog.check(now - start)
                    deadline = time.monotonic() + self.watchdog.timeout
        finally:
            if watching:
                assert ahead is not None
                sel.unregister(ahead[1])

    def _watch(self, ahead: tuple[ReadAhead, int, Callable[[], bool]]) -> bool:
        """Watch the stream's socket too; False if it is gone (then only the target)."""
        try:
            self._sel.register(ahead[1], selectors.EVENT_READ, _AHEAD)
        except (OSError, ValueError):
            ahead[0].stopped = True
            return False
        return True

    def reenter_pipeline(self) -> None:
        try:
            self._enter_pipeline()
        except psycopg.OperationalError as e:
            raise lost(e) from None

    def _enter_pipeline(self) -> None:
        self.pg.enter_pipeline_mode()
        self._pipeline = True

    def _after_send(self) -> None:
        self._sent += 1
        if self._sent % PUMP_EVERY == 0:
            self._pump(until_empty=False)
            if self.failure is not None:
                self.raise_failure()

    def _pump(self, until_empty: bool) -> None:
        """Send what libpq holds and read what results have come, waiting only if needed."""
        pg = self.pg
        q = self._q
        asked = False
        try:
            while True:
                pending = pg.flush()
                pg.consume_input()
                self._drain()
                inflight = len(q) + self._held_rows
                if pending == 0 and (not q or not until_empty) and inflight <= self.max_inflight:
                    return
                if inflight > self.max_inflight and not asked:
                    # The server holds small results back until a Flush or Sync (a
                    # few hundred of them fit its buffer): waiting alone would hang.
                    pg.send_flush_request()
                    asked = True
                    continue
                self._select(bool(pending))
        except psycopg.OperationalError as e:
            raise lost(e) from None

    def _catch_up(self, until_empty: bool) -> None:
        """Ask for the results the server holds back (small ones wait for a Flush or
        Sync) and read them, all of them or as far as :meth:`_pump` bounds them, so
        the changes they hold are let go (MAX_INFLIGHT, MAX_INFLIGHT_BYTES)."""
        try:
            self.pg.send_flush_request()
        except psycopg.OperationalError as e:
            raise lost(e) from None
        self._pump(until_empty)
        if self.failure is not None:
            self.raise_failure()

    def _drain(self) -> None:
        pg = self.pg
        q = self._q
        while q and not pg.is_busy():
            res = pg.get_result()
            kind, ctx = q[0]
            if res is None:
                if kind != _SYNC:
                    q.popleft()
                    if kind in _CHECKS:
                        self._checks -= 1
                    if kind in (_MANY, _MANY_LAZY):
                        self._held_rows -= len(ctx) - 1
                continue
            status = res.status
            if status == ExecStatus.PIPELINE_SYNC:
                q.popleft()
                # A commit's Sync: (callback, guard id, waited, end_lsn).
                if ctx is not None and self.failure is None:
                    self._guard_committed = ctx[1]
                    self.committed = ctx[3]
                    ctx[0](self._local_lsn)
            elif status == ExecStatus.FATAL_ERROR:
                self._parse_failed(kind, ctx)
                if self.failure is None:
                    self.failure = (res, ctx)
                    self.failed_inflight = self._failed_in_pipelined_commit()
            elif status == ExecStatus.PIPELINE_ABORTED:
                # Skipped after an error: no row count to judge, and a Parse skipped
                # leaves no statement behind.
                self._parse_failed(kind, ctx)
            elif kind in (_MOD, _MOD_LAZY):
                if res.command_tuples == 0:
                    self.on_missing(ctx)
            elif kind in (_MANY, _MANY_LAZY):
                if res.ntuples < len(ctx):
                    # RETURNING gave the (1-based) ordinals of the rows found.
                    found = {int(res.get_value(i, 0) or 0) for i in range(res.ntuples)}
                    for n, row in enumerate(ctx.ctxs, 1):
                        if n not in found:
                            self.on_missing(row)
            elif kind == _CHECK:
                ctx.check(ctx, res)
            elif kind == _LSN and status == ExecStatus.TUPLES_OK:
                value, flushed = res.get_value(0, 0), res.get_value(0, 1)
                if value:
                    self._local_lsn = Lsn.parse(value.decode())
                if flushed:
                    self.flushed_seen = Lsn(max(self.flushed_seen, Lsn.parse(flushed.decode())))
        if not q:
            self._bytes_out = 0

    def read_checks(self) -> None:
        """Read every result that may report a conflict (before a commit is sent), so
        the conflicts of a transaction are known, and recorded, inside it."""
        if not self._checks or not self._pipeline:
            return
        pg = self.pg
        try:
            pg.send_flush_request()  # the server holds results back until a Sync or Flush
            while self._checks and self.failure is None:
                pending = pg.flush()
                pg.consume_input()
                self._drain()
                if not self._checks or self.failure is not None:
                    break
                self._select(bool(pending))
        except psycopg.OperationalError as e:
            raise lost(e) from None
        if self.failure is not None:
            self.raise_failure()

    def _parse_failed(self, kind: int, ctx: Any) -> None:
        if kind == _CTL and isinstance(ctx, tuple) and ctx[0] == "prepare":
            self._prepared.discard(ctx[2])

    def _failed_in_pipelined_commit(self) -> bool:
        """Whether the failing item (the queue's head) belongs to a commit sent without
        waiting: the worker has moved on, so its context may name a later transaction."""
        for kind, ctx in self._q:
            if kind == _SYNC and ctx is not None:
                return not ctx[2]
        return False

    def sync_pipeline(self) -> None:
        """Sync the pipeline, wait for everything, leave pipeline mode."""
        try:
            self.pg.pipeline_sync()
        except psycopg.OperationalError as e:
            raise lost(e) from None
        self._q.append((_SYNC, None))
        self._pump(until_empty=True)
        try:
            self.pg.exit_pipeline_mode()
            self._pipeline = False
        except psycopg.OperationalError as e:
            raise lost(e) from None

    def raise_failure(self) -> None:
        assert self.failure is not None
        res, ctx = self.failure
        state, msg = error_fields(res)
        detail_b = res.error_field(pq.DiagnosticField.MESSAGE_DETAIL)
        if detail_b:
            msg += f" ({detail_b.decode('utf-8', 'replace').strip()})"
        context = dict(self.txn_context)
        for k in ("lsn", "finish_lsn"):
            if k in context:
                context[k] = str(Lsn(context[k]))
        describe = getattr(ctx, "describe", None)
        if callable(describe):
            context.update(describe())
        elif isinstance(ctx, tuple) and ctx and ctx[0] == "prepare":
            inner = getattr(ctx[1], "describe", None)
            if callable(inner):
                context.update(inner())
        elif ctx == "guard":
            msg = f"an earlier target transaction of this session did not commit ({msg})"
        elif isinstance(ctx, str):
            msg = f"{ctx}: {msg}"
        if is_transient_sqlstate(state):
            raise ConnectionLost(f"the target failed: {msg}", sqlstate=state)
        err = ApplyError(f"the target refused a change: {msg}", sqlstate=state, **context)
        # The change itself, for the worker to name a conflict (applier.apply.rules.resolve).
        err.change_ctx = ctx  # type: ignore[attr-defined]
        raise err
