"""Runs of INSERTs as ``COPY ... FROM STDIN``: the row encoding, with no I/O.

A prepared INSERT costs the target a Bind/Execute with executor start-up per
row; COPY costs it one input-function call per value. So consecutive INSERTs
into one table with the same columns and value format (a *run*) are held back
by the session; once the run reaches ``[apply] copy_threshold`` rows (or
:data:`~applier.apply.sql.planner.MAX_HELD_BYTES` of values: wide rows are not
all held, and they are where COPY pays most) it is
sent as one COPY (libpq cannot COPY inside a pipeline: the session syncs and
leaves pipeline mode first, which costs one round trip, hence the threshold),
and every further row of the run is appended to that COPY as it arrives. A run
that ends below the threshold goes out as multi-row INSERTs
(:func:`~applier.apply.sql.planner.insert_rows`, still inside the pipeline; one
prepared INSERT per row in the worker's one-by-one replay after a failure, so
that an error names its row). Either way
the rows reach the target in the order the source wrote them, inside the same
target transaction, so nothing about exactly-once changes.

Values are the protocol's bytes: text values are escaped for COPY's text format
(``\\``, tab, newline, carriage return; NULL is ``\\N``), binary values
(``[apply] binary``) go into COPY's binary format as they are, since both are
what the type's input or receive function reads. A row mixing text and binary
values cannot be copied and is applied with INSERT. The framing of a row runs
by :mod:`applier.speedups` (C when built, else the Python twins there).

An error in a COPY names its line; :class:`Run` keeps each row's source LSN and
xid (not the row) so the error still names the change that failed.
"""

from __future__ import annotations

import re
import struct
from array import array
from itertools import chain

from applier.apply.sql.planner import Formats, Params, Stmt
from applier.lsn import Lsn
from applier.speedups import copy_binary_row as binary_row
from applier.speedups import copy_text_row as text_row

TEXT, BINARY, NO_COPY = 0, 1, -1

#: Hand rows to libpq in chunks of about this size.
CHUNK = 256 * 1024
#: Weigh the rows held back every this many (a power of two).
WEIGH_EVERY = 16

BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
BINARY_TRAILER = struct.pack(">h", -1)
_LINE = re.compile(r"\bline (\d+)")


def row_format(params: Params, fmts: Formats) -> int:
    """TEXT or BINARY when every non-NULL value has that format, else NO_COPY."""
    if fmts is None:
        return TEXT
    # NULLs are always format 0: all non-NULL values are binary exactly when the
    # zero formats are the NULLs.
    return BINARY if fmts.count(0) == params.count(None) else NO_COPY


def copy_query(stmt: Stmt, fmt: int) -> bytes:
    return stmt.copy + (b" (FORMAT binary)" if fmt == BINARY else b"")


def error_line(context: str | None) -> int | None:
    """The 1-based COPY line an error's CONTEXT names (``COPY t, line 3, ...``)."""
    m = _LINE.search(context or "")
    return int(m.group(1)) if m else None


class Run:
    """Consecutive INSERTs of one statement and format: held back, then copied."""

    __slots__ = (
        "buf",
        "copying",
        "first_ctx",
        "fmt",
        "held",
        "lsns",
        "pending",
        "stmt",
        "weighed",
        "xids",
    )

    def __init__(self, stmt: Stmt, fmt: int) -> None:
        self.stmt = stmt
        self.fmt = fmt
        #: Rows held back until the run is long enough for COPY.
        self.pending: list[tuple[Params, Formats, object]] = []
        #: Bytes of the values of ``pending[:weighed]``.
        self.held = 0
        self.weighed = 0
        self.copying = False
        self.buf = bytearray()
        #: Source LSN and xid per copied row, for errors.
        self.lsns = array("Q")
        self.xids = array("q")
        self.first_ctx: object = None

    def weigh(self) -> int:
        """The bytes of the values held back (the session asks every WEIGH_EVERY
        rows: summing them per row cost a tenth of a run's CPU)."""
        rows = self.pending[self.weighed :]
        self.weighed += len(rows)
        self.held += sum(map(len, filter(None, chain.from_iterable([row[0] for row in rows]))))
        return self.held

    def start(self) -> None:
        """Switch to copying: the held-back rows become the COPY's first lines."""
        self.copying = True
        if self.fmt == BINARY:
            self.buf += BINARY_HEADER
        pending, self.pending = self.pending, []
        self.held = self.weighed = 0
        if pending:
            self.first_ctx = pending[0][2]
        for params, _fmts, ctx in pending:
            self.add(params, getattr(ctx, "lsn", 0), getattr(ctx, "xid", None))

    def add(self, params: Params, lsn: int, xid: int | None) -> None:
        self.buf += binary_row(params) if self.fmt == BINARY else text_row(params)
        self.lsns.append(lsn)
        self.xids.append(-1 if xid is None else xid)

    def take(self, last: bool = False) -> bytes:
        """The encoded rows not yet handed to libpq (with the trailer when ``last``)."""
        if last and self.fmt == BINARY:
            self.buf += BINARY_TRAILER
        data = bytes(self.buf)
        self.buf.clear()
        return data

    def where(self, line: int | None) -> dict[str, object]:
        """The LSN/xid of COPY line ``line`` (1-based), for an error's context."""
        if line is None or not 1 <= line <= len(self.lsns):
            return {}
        xid = self.xids[line - 1]
        return {"lsn": str(Lsn(self.lsns[line - 1])), "xid": None if xid < 0 else xid}
