"""A prepared statement, and the SQL pieces every statement builder uses.

:class:`Stmt` is what the planners (:mod:`.planner`, the conflict statements of
:mod:`applier.apply.rules.conflicts`) build and the target session prepares and
sends; the helpers here (placeholders, the table an UPDATE names, a column
comparison, parameter formats, the multi-row forms and their bounds, a change's
identity) are shared by those builders and by what names a change in errors and
records. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import sql

from applier.apply.sql.mapping import RelMap, TargetColumn
from applier.protocol import Delete, Insert, TupleData, Update

#: ``kinds.translate(_FORMAT)``: the libpq parameter format of each value.
_FORMAT = bytes(1 if i == ord("b") else 0 for i in range(256))

Params = list[bytes | None]
Formats = bytes | None


@dataclass(frozen=True, slots=True)
class Stmt:
    """A prepared statement for one (mapping, operation, shape)."""

    name: bytes
    query: bytes
    types: tuple[int, ...]
    #: Source column indexes whose new values are the first parameters.
    new_idx: tuple[int, ...]
    #: Source column indexes whose old (or key) values follow.
    where_idx: tuple[int, ...]
    #: Whether the statement must affect a row (UPDATE/DELETE).
    modifies: bool
    #: Whether every column is used in order (insert fast path).
    all_new: bool
    #: INSERT only: ``COPY ... FROM STDIN`` for the same columns (b"" when the
    #: target cannot take COPY); see :mod:`applier.apply.sql.copyrun`.
    copy: bytes = b""
    #: INSERT only: the query up to VALUES, for the multi-row form (:func:`insert_rows`).
    head: bytes = b""


def placeholder(n: int) -> sql.SQL:
    """The n-th parameter of a prepared statement: ``$n``."""
    return sql.SQL("$" + str(n))


def qualified(rm: RelMap) -> sql.Composable:
    """The target table of a mapping, schema-qualified."""
    return sql.Identifier(rm.relation.namespace, rm.relation.name)


def changed_relation(rm: RelMap) -> sql.Composable:
    """The relation an UPDATE/DELETE/TRUNCATE names: ``ONLY`` unless partitioned, so an
    inheritance parent never reaches its children's rows (same key, same ctid)."""
    if rm.target is not None and rm.target.partitioned:
        return qualified(rm)
    return sql.Composed([sql.SQL("ONLY "), qualified(rm)])


def compare(
    col: TargetColumn, left: sql.Composable, right: sql.Composable, distinct: bool = False
) -> sql.Composable:
    """``left = right`` for a column (``IS NOT DISTINCT FROM`` with ``distinct``),
    both sides as text for a type without ``=``."""
    if not col.has_eq:
        left = sql.Composed([left, sql.SQL("::pg_catalog.text")])
        right = sql.Composed([right, sql.SQL("::pg_catalog.text")])
    op = sql.SQL(" IS NOT DISTINCT FROM ") if distinct else sql.SQL(" = ")
    return sql.Composed([left, op, right])


#: Most parameters one statement may carry (the protocol counts them in 16 bits).
MAX_PARAMS = 65535
#: Rows held back for one statement or COPY (a run's, the merger's) are sent once
#: their values reach about this many bytes, whatever their count: wide rows must
#: not all be held (256 merged UPDATEs of 1 MB rows were 363 MB of RSS).
MAX_HELD_BYTES = 8 * 1024 * 1024


def max_rows(width: int, limit: int) -> int:
    """The largest power of two <= ``limit`` rows of ``width`` parameters one statement takes."""
    rows = limit
    while rows > 1 and rows * width > MAX_PARAMS:
        rows //= 2
    return rows


def values_rows(n: int, width: int) -> sql.Composable:
    """``(1, $1, .. $width), (2, ..)``: ``n`` rows of parameters, each after its ordinal."""
    return sql.SQL(", ").join(
        sql.SQL("({}, {})").format(
            sql.Literal(r + 1),
            sql.SQL(", ").join(placeholder(r * width + j + 1) for j in range(width)),
        )
        for r in range(n)
    )


def insert_rows(stmt: Stmt, n: int) -> Stmt:
    """The INSERT ``stmt`` with ``n`` rows of parameters in one VALUES list."""
    width = len(stmt.types)
    rows = b", ".join(
        b"(" + b", ".join(b"$%d" % (r * width + j) for j in range(1, width + 1)) + b")"
        for r in range(n)
    )
    name = stmt.name + b"_x%d" % n
    return Stmt(name, stmt.head + rows, stmt.types * n, stmt.new_idx, (), False, stmt.all_new)


def param_formats(kinds: bytes, idx: tuple[int, ...]) -> bytes:
    """The libpq parameter formats of the values at ``idx`` (1 for binary)."""
    fmts = kinds.translate(_FORMAT)
    return bytes(fmts[i] for i in idx)


def identity_tuple(change: Any) -> TupleData | None:
    """The tuple that holds a change's identity: the new row of an INSERT, the old key
    (or the new row when the key did not change) of an UPDATE, the old of a DELETE."""
    if isinstance(change, Insert):
        return change.new
    if isinstance(change, Update):
        return change.old if change.old is not None else change.new
    if isinstance(change, Delete):
        return change.old
    return None


def key_of(rm: RelMap, change: Any) -> dict[str, str | None] | None:
    """The identity values of a change, as text, for error messages."""
    tup = identity_tuple(change)
    if tup is None:
        return None
    cols = rm.relation.columns
    idx = rm.key or tuple(i for i, k in enumerate(tup.kinds) if k != ord("u"))
    out: dict[str, str | None] = {}
    for i in idx[:8]:
        v = tup.values[i]
        if v is None:
            out[cols[i].name] = None
        elif tup.kinds[i] == ord("b"):
            out[cols[i].name] = "\\x" + v[:64].hex()
        else:
            text = v.decode("utf-8", "replace")
            out[cols[i].name] = text if len(text) <= 200 else text[:200] + "..."
    return out


#: Keys held per table before they are sent (also the largest chunk).
MAX_HELD = 256


def chunks(n: int, limit: int) -> list[int]:
    """``n`` as a sum of powers of two, largest first, each at most ``limit`` (a power of two).

    Statements are prepared per row count: a few sizes keep their number small.
    """
    out = [limit] * (n // limit)
    rest = n % limit
    bit = limit
    while rest:
        if rest & bit:
            out.append(bit)
            rest -= bit
        bit >>= 1
    return out
