"""Runs of INSERTs: held back, then sent as COPY or multi-row INSERTs (the session's half).

:mod:`applier.apply.sql.copyrun` encodes the rows (no I/O); :class:`InsertRuns`,
a part that :class:`~applier.apply.target.session.TargetSession` owns, decides when a run starts and
ends and talks to the server: a run that reaches ``copy_threshold`` rows (or
:data:`~applier.apply.sql.planner.MAX_HELD_BYTES` of values) leaves the pipeline
for one ``COPY ... FROM STDIN`` (libpq has no COPY in pipeline mode), a
shorter one goes as multi-row INSERTs inside the pipeline,
and runs of checked INSERTs (:mod:`applier.apply.rules.conflicts`) go as multi-row
statements whose results name the rows not inserted. Every other call of the
session ends the run in hand first, so statements reach the target in source
order. The copy lane (:mod:`applier.apply.batching.copylane`) appends encoded rows to
the COPY in hand.

What the part needs of its session is :class:`RunLink`: the connection, the
pipeline's sync and re-entry, its first failure, and the session's own
``execute`` for rows that go as statements.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any, Protocol

import psycopg
from psycopg import pq

from applier.apply.core.states import MergedCtx
from applier.apply.sql.copyrun import (
    CHUNK,
    NO_COPY,
    WEIGH_EVERY,
    Run,
    copy_query,
    error_line,
    row_format,
)
from applier.apply.sql.planner import MAX_HELD_BYTES, Formats, Params, Stmt, insert_rows, max_rows
from applier.apply.sql.stmt import MAX_HELD, chunks
from applier.apply.target.pipeline import ExecStatus, lost
from applier.errors import ConnectionLost


class RunLink(Protocol):
    """What :class:`InsertRuns` needs of its session (a pipeline on the target)."""

    #: The connection's libpq object.
    pg: pq.abc.PGconn
    #: The first error the pipeline read, with the context of its change.
    failure: tuple[pq.abc.PGresult, Any] | None

    def execute(
        self,
        stmt: Stmt,
        params: Params,
        formats: Formats,
        ctx: Any,
        merged: bool = False,
        checked: bool = False,
    ) -> None:
        """Queue one prepared statement in the pipeline."""

    def sync_pipeline(self) -> None:
        """Wait for every result queued, leaving pipeline mode."""

    def reenter_pipeline(self) -> None:
        """Enter pipeline mode again after a COPY."""

    def raise_failure(self) -> None:
        """Raise :attr:`failure` as the apply error it is."""

    def next_result(self) -> pq.abc.PGresult | None:
        """The next result, waiting on the socket for it."""

    def collect(self, first: pq.abc.PGresult | None) -> pq.abc.PGresult | None:
        """Read results to the end of a query: its error, if any."""

    def wait_socket(self, write: bool) -> None:
        """Wait until the socket is readable (or writable)."""


class InsertRuns:
    """Runs of INSERTs of one session (see the module docstring)."""

    __slots__ = ("_link", "_multi", "copy_threshold", "multi_row", "run")

    def __init__(self, link: RunLink, copy_threshold: int) -> None:
        self._link = link
        #: Runs of at least this many INSERTs go out as COPY (0: never).
        self.copy_threshold = copy_threshold
        #: The run in hand, held back, copying or checked; None between runs.
        self.run: Run | None = None
        #: A run shorter than that goes as multi-row INSERTs (else one by one, so
        #: an error names its row: the worker's replay after a failure).
        self.multi_row = True
        #: The multi-row INSERT of each (statement, rows) made so far.
        self._multi: dict[tuple[bytes, int], Stmt] = {}

    def insert(self, stmt: Stmt, params: Params, formats: Formats, ctx: Any) -> None:
        """Queue one INSERT; ``ctx`` (with ``lsn`` and ``xid``) identifies it in errors."""
        fmt = row_format(params, formats)
        run = self.run
        if run is None or run.stmt is not stmt or run.fmt != fmt:
            if run is not None:
                self.end_run()
            if not stmt.copy or fmt == NO_COPY or self.copy_threshold <= 0:
                self._link.execute(stmt, params, formats, ctx)
                return
            run = self.run = Run(stmt, fmt)
        if run.copying:
            run.add(params, ctx.lsn, ctx.xid)
            if len(run.buf) >= CHUNK:
                self._copy_put(run, run.take())
        else:
            pending = run.pending
            pending.append((params, formats, ctx))
            n = len(pending)
            if n >= self.copy_threshold or (
                not n & (WEIGH_EVERY - 1) and run.weigh() >= MAX_HELD_BYTES
            ):
                self.copy_begin(run)

    def run_in_hand(self) -> Run | None:
        """The run of plain INSERTs in hand, held back or copying (see batching.insertlane)."""
        run = self.run
        return run if type(run) is Run else None

    def copy_in_hand(self) -> Run | None:
        """The run whose rows are being copied now, if any (applier.apply.batching.copylane)."""
        run = self.run
        return run if type(run) is Run and run.copying else None

    def copy_line(self, run: Run, line: bytes, lsn: int, xid: int) -> None:
        """Append one encoded row to the COPY of ``run`` (the run in hand)."""
        run.buf += line
        run.lsns.append(lsn)
        run.xids.append(xid)
        if len(run.buf) >= CHUNK:
            self._copy_put(run, run.take())

    def copy_lines(self, run: Run, lines: bytes, lsns: list[int], xid: int) -> None:
        """:meth:`copy_line` of several rows of one transaction: ``lines`` joined."""
        run.buf += lines
        run.lsns.extend(lsns)
        run.xids.extend(array("q", (xid,)) * len(lsns))
        if len(run.buf) >= CHUNK:
            self._copy_put(run, run.take())

    def insert_checked(
        self, stmt: Stmt, params: Params, formats: Formats, ctx: Any, run_of: Any
    ) -> None:
        """Queue one INSERT of :mod:`applier.apply.rules.conflicts` into a run of them.

        ``run_of(stmt, n, ctxs)`` gives the statement for ``n`` rows of ``stmt`` and
        the context of their result. ``ctx.key`` (hashable) is the row's key: a key
        already in the run ends it first, so a row never conflicts with one of its
        own statement (which the result could not tell from a target row).
        """
        run = self.run
        if run is not None and (
            not isinstance(run, CheckedRun) or run.stmt is not stmt or ctx.key in run.keys
        ):
            self.end_run()
            run = None
        if run is None:
            run = self.run = CheckedRun(stmt, run_of)
        run.keys.add(ctx.key)
        pending = run.pending
        pending.append((params, formats, ctx))
        n = len(pending)
        if n >= MAX_HELD or (not n & (WEIGH_EVERY - 1) and run.weigh() >= MAX_HELD_BYTES):
            self.end_run()

    def forget(self, doomed: set[bytes]) -> None:
        """Drop the multi-row forms of the statements ``doomed`` (adding their names
        to it) and send the run in hand if it is of one of them."""
        for key in [k for k in self._multi if k[0] in doomed]:
            doomed.add(self._multi.pop(key).name)
        if self.run is not None and self.run.stmt.name in doomed:
            self.end_run()

    def end_run(self, abort: bool = False) -> None:
        """Send the run in hand: the rest of its COPY, or its rows as INSERTs."""
        run, self.run = self.run, None
        if run is None:
            return
        if isinstance(run, CheckedRun):
            if not abort:
                self._send_checked(run)
            return
        if run.copying:
            self._copy_end(run, abort)
        elif abort:
            return
        elif self.multi_row and len(run.pending) > 1:
            self._insert_rows(run)
        else:
            for params, formats, ctx in run.pending:
                self._link.execute(run.stmt, params, formats, ctx)

    def _chunks(
        self, run: Run
    ) -> Iterator[tuple[list[tuple[Params, Formats, Any]], Params, Formats]]:
        """A run's rows in power-of-two chunks, in order: (rows, their parameters in
        one list, their formats: None when every row is text)."""
        pending = run.pending
        width = len(run.stmt.types)
        start = 0
        for size in chunks(len(pending), max_rows(width, MAX_HELD)):
            rows = pending[start : start + size]
            start += size
            params: Params = []
            for row in rows:
                params += row[0]
            formats: Formats = None
            if any(row[1] is not None for row in rows):
                zeros = bytes(width)
                formats = b"".join([row[1] or zeros for row in rows])
            yield rows, params, formats

    def _insert_rows(self, run: Run) -> None:
        """A run too short for COPY: its rows in a few multi-row INSERTs, in order."""
        for rows, params, formats in self._chunks(run):
            if len(rows) == 1:
                self._link.execute(run.stmt, *rows[0])
                continue
            stmt = self._multi.get((run.stmt.name, len(rows)))
            if stmt is None:
                stmt = self._multi[(run.stmt.name, len(rows))] = insert_rows(run.stmt, len(rows))
            self._link.execute(stmt, params, formats, MergedCtx([row[2] for row in rows]))

    def _send_checked(self, run: CheckedRun) -> None:
        """A run of checked INSERTs as a few multi-row statements, in order."""
        for rows, params, formats in self._chunks(run):
            if len(rows) == 1:
                self._link.execute(run.stmt, *rows[0], checked=True)
                continue
            stmt, group_ctx = run.run_of(run.stmt, len(rows), [row[2] for row in rows])
            self._link.execute(stmt, params, formats, group_ctx, checked=True)

    def copy_begin(self, run: Run) -> None:
        """Turn ``run`` (the run in hand, held back) into a COPY and send its rows."""
        # libpq has no COPY in pipeline mode: wait for what is queued, leave the
        # pipeline, COPY, and enter it again at the end of the run.
        self._link.sync_pipeline()
        pg = self._link.pg
        if self._link.failure is not None:
            self.run = None
            self._link.reenter_pipeline()
            self._link.raise_failure()
        try:
            pg.send_query(copy_query(run.stmt, run.fmt))
            res = self._link.next_result()
        except psycopg.OperationalError as e:
            raise lost(e) from None
        if res is None or res.status != ExecStatus.COPY_IN:
            self.run = None
            self._link.collect(res)
            self._link.failure = (res, run.pending[0][2]) if res is not None else None
            self._link.reenter_pipeline()
            if self._link.failure is not None:
                self._link.raise_failure()
            raise ConnectionLost("the target did not start the COPY")
        run.start()
        self._copy_put(run, run.take())

    def _copy_put(self, run: Run, data: bytes) -> None:
        pg = self._link.pg
        try:
            while pg.put_copy_data(data) == 0:
                self._link.wait_socket(write=True)
            # Back-pressure: libpq's buffer would grow without bound in
            # non-blocking mode; hold it to what the socket takes.
            while pg.flush():
                self._link.wait_socket(write=True)
        except psycopg.OperationalError as e:
            if pg.status != pq.ConnStatus.OK:
                raise lost(e) from None
            # The server ended the COPY with an error: collect and report it.
            self.run = None
            self._copy_failed(run, self._link.collect(None))

    def _copy_end(self, run: Run, abort: bool) -> None:
        pg = self._link.pg
        try:
            if not abort:
                self._copy_put(run, run.take(last=True))
            while pg.put_copy_end(b"applier: rolled back" if abort else None) == 0:
                self._link.wait_socket(write=True)
            error = self._link.collect(None)
        except psycopg.OperationalError as e:
            raise lost(e) from None
        if abort:
            self._link.reenter_pipeline()
        else:
            self._copy_failed(run, error)

    def _copy_failed(self, run: Run, error: pq.abc.PGresult | None) -> None:
        self._link.reenter_pipeline()
        if error is not None:
            ctx_b = error.error_field(pq.DiagnosticField.CONTEXT)
            line = error_line(ctx_b.decode("utf-8", "replace") if ctx_b else None)
            self._link.failure = (error, _CopyCtx(run, line))
            self._link.raise_failure()


class CheckedRun(Run):
    """Consecutive checked INSERTs of one statement (never copied)."""

    __slots__ = ("keys", "run_of")

    def __init__(self, stmt: Stmt, run_of: Any) -> None:
        super().__init__(stmt, 0)
        self.run_of = run_of
        self.keys: set[Any] = set()


class _CopyCtx:
    """Error context of a COPY run: the change on the failing line."""

    def __init__(self, run: Run, line: int | None) -> None:
        self.run = run
        self.line = line

    def describe(self) -> dict[str, Any]:
        first = getattr(self.run.first_ctx, "describe", None)
        out: dict[str, Any] = dict(first()) if callable(first) else {}
        out.pop("key", None)  # the first row's; the server's DETAIL names the failing key
        out.update(self.run.where(self.line))
        if self.line is not None:
            out["copy_line"] = self.line
        return out
