"""The tables ``applier verify`` compares, and the key ranges it cuts them into.

A table's *key* is its primary key, else its replica-identity index: the
columns the apply engine finds rows by, so a row is the same row on both
sides exactly when its key is. ctids are never used (they differ between
the two clusters). A table with neither (``REPLICA IDENTITY FULL`` or
none) has no key and is compared whole, as a multiset of row hashes.

Ranges are half-open intervals of the key, ``lo <= key < hi`` compared as a
row (``ROW(k1, k2) >= ROW(...)``, which a btree index on the key answers),
the first open below and the last open above, so that together they cover
every key either side may hold. Bounds are the key's text forms, taken from
the source and cast back to the key's types in each query.

The cuts come from a cheap sample: ``TABLESAMPLE SYSTEM`` reads one random
page per piece wanted and keeps one key of each, whose sorted list gives the
quantiles (a skewed sample only makes ranges uneven, never misses a row). A
range is about ``chunk_rows`` rows ([verify] chunk_rows, default 1M: one
query a side for a million rows, several ranges at once); the sampled keys
inside it are its *cuts*: the range's first hash is taken per
piece between them, in the same single scan (``width_bucket``), so a
difference is already located to a piece of about ``PIECE_ROWS`` rows. A
one-column integer key is cut instead every ``step`` values between the
range's bounds (:func:`even_cuts`), for pieces of about ``INT_PIECE_ROWS``
rows: more pieces than the sample has keys, and none of the sampled gaps'
unevenness (a difference falls more often in a big piece than in a small
one). The differing pieces of a range are then narrowed by buckets of a
hash of the key (:mod:`.task`), which need no cut.

Keys compare under each server's collation: a text key whose collations
sort differently on the two servers could put one row in different ranges
on each side; the narrowing then fetches it on both sides anyway, but from
two different ranges (reported as missing and extra). Keys of numbers,
dates or uuids are not affected.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

Conn = psycopg.Connection[Any]
Bound = tuple[str, ...]


@dataclass(frozen=True)
class VTable:
    """One table to compare: where it is on each side, its columns and key."""

    src: tuple[str, str]
    dst: tuple[str, str]
    columns: tuple[str, ...]  # present on both sides, compared by name
    key: tuple[str, ...]  # empty: no key, compared as a multiset
    key_types: tuple[str, ...]  # the source's format_type() of each key column
    row_filter: str | None = None  # the publication's row filter (on both sides)
    only: bool = True  # ONLY: an inheritance child is a table of its own
    est_rows: int = 0
    #: hashtextextended (both servers hash alike) or md5 (see applier.verify.hashing).
    fast_hash: bool = False
    #: hash_record_extended: every column hashed by value (see applier.verify.hashing).
    record_hash: bool = False

    @property
    def name(self) -> str:
        return f"{self.src[0]}.{self.src[1]}"


@dataclass(frozen=True)
class KeyRange:
    """``lo <= key < hi``; None: unbounded on that side.

    ``cuts``: keys inside the range at which its first hash is already split
    (one scan, a hash per piece), so a difference is located to a piece
    without reading the range again.
    """

    lo: Bound | None = None
    hi: Bound | None = None
    cuts: tuple[Bound, ...] = ()

    def pieces(self) -> list[KeyRange]:
        bounds: list[Bound | None] = [self.lo, *self.cuts, self.hi]
        return [KeyRange(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def key_columns(conn: Conn, schema: str, name: str) -> list[tuple[str, str]]:
    """(column, type) of the primary key, else of the replica-identity index; [] if none."""
    from ..bootstrap.plan import quote_qual

    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
        "CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n) "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = %s::regclass AND k.n <= i.indnkeyatts "
        "  AND (i.indisprimary OR (c.relreplident = 'i' AND i.indisreplident)) "
        "ORDER BY i.indisprimary DESC, i.indexrelid, k.n",
        (quote_qual(schema, name),),
    ).fetchall()
    if not rows:
        return []
    # Two indexes can match (a PK and another replica-identity index): the first one's.
    first: list[tuple[str, str]] = []
    for attname, typ in rows:
        if (attname, typ) in first:
            break
        first.append((attname, typ))
    return first


def _exists(conn: Conn, schema: str, name: str) -> bool:
    from ..bootstrap.plan import quote_qual

    row = conn.execute("SELECT to_regclass(%s)", (quote_qual(schema, name),)).fetchone()
    return row is not None and row[0] is not None


def tables_to_verify(src: Conn, tgt: Conn, cfg: Any, patterns: list[str] | None) -> list[VTable]:
    """The published, included tables (narrowed by ``--tables`` patterns) that the target has.

    A partition the target lacks while it has the partition tree's root
    (the target is not partitioned alike) is compared at the root: the
    source's whole tree against the target's table.
    """
    from ..bootstrap.plan import discover, target_columns
    from ..config import table_matches

    plan = discover(src, cfg)
    out: dict[tuple[str, str], VTable] = {}
    for t in plan.tables:
        if patterns and not any(table_matches(p, t.schema, t.name) for p in patterns):
            continue
        src_rel, dst, only = (t.schema, t.name), (t.schema, t.name), True
        if not _exists(tgt, *dst):
            if t.root == dst or not _exists(tgt, *t.root):
                continue  # the schema comparison reports the missing table
            src_rel, dst, only = t.root, t.root, False
        if dst in out:
            continue
        on_target = target_columns(tgt, *dst)
        cols = tuple(c.name for c in t.columns if c.name in on_target)
        key = key_columns(src, *src_rel)
        if key and not all(k in cols for k, _ in key):
            key = []  # a key column missing on the target: compare as a multiset
        out[dst] = VTable(
            src=src_rel,
            dst=dst,
            columns=cols,
            key=tuple(k for k, _ in key),
            key_types=tuple(ty for _, ty in key),
            row_filter=t.row_filter,
            only=only,
            est_rows=t.est_rows,
        )
    return list(out.values())


# -- SQL pieces -------------------------------------------------------------------------


def relation(t: VTable, side: str) -> sql.Composable:
    rel = t.src if side == "source" else t.dst
    return sql.SQL("ONLY {}" if t.only else "{}").format(sql.Identifier(*rel))


def _key_row(t: VTable) -> sql.Composable:
    return sql.SQL("ROW({})").format(sql.SQL(", ").join(sql.Identifier(k) for k in t.key))


def _bound_row(t: VTable) -> sql.Composable:
    # format_type() output is catalog text, not user input.
    return sql.SQL("ROW({})").format(
        sql.SQL(", ").join(sql.SQL("%s::{}").format(sql.SQL(ty)) for ty in t.key_types)
    )


def range_where(t: VTable, rng: KeyRange) -> tuple[sql.Composable, list[Any]]:
    """The WHERE condition of one range (and the row filter), with its parameters."""
    parts: list[sql.Composable] = []
    params: list[Any] = []
    if rng.lo is not None:
        parts.append(sql.SQL("{} >= {}").format(_key_row(t), _bound_row(t)))
        params += rng.lo
    if rng.hi is not None:
        parts.append(sql.SQL("{} < {}").format(_key_row(t), _bound_row(t)))
        params += rng.hi
    if t.row_filter:
        parts.append(sql.SQL("({})").format(sql.SQL(t.row_filter)))
    if not parts:
        return sql.SQL("true"), params
    return sql.SQL(" AND ").join(parts), params


def ranges_where(t: VTable, ranges: list[KeyRange]) -> tuple[sql.Composable, list[Any]]:
    """The rows of any of these ranges: adjacent ones joined, the rest OR-ed (each an
    index range scan of its own; a BitmapOr)."""
    joined: list[KeyRange] = []
    for r in ranges:
        if joined and joined[-1].hi is not None and joined[-1].hi == r.lo:
            joined[-1] = KeyRange(joined[-1].lo, r.hi)
        else:
            joined.append(KeyRange(r.lo, r.hi))
    if len(joined) == 1:
        return range_where(t, joined[0])
    parts, params = [], []
    for r in joined:
        where, p = range_where(t, r)
        parts.append(sql.SQL("({})").format(where))
        params += p
    return sql.SQL(" OR ").join(parts), params


def key_order(t: VTable, alias: str | None = None) -> sql.Composable:
    return sql.SQL(", ").join(
        sql.Identifier(alias, k) if alias else sql.Identifier(k) for k in t.key
    )


def key_text(t: VTable) -> sql.Composable:
    return sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(k)) for k in t.key)


# -- cutting ----------------------------------------------------------------------------


def _row_count(conn: Conn, t: VTable) -> int:
    where, params = range_where(t, KeyRange())
    q = sql.SQL("SELECT count(*) FROM {} WHERE {}").format(relation(t, "source"), where)
    row = conn.execute(q, params).fetchone()
    return int(row[0]) if row else 0


#: Rows of a piece of the first pass (a range is hashed per piece, in one scan): a
#: difference is located to a piece, whose rows alone are scanned again.
PIECE_ROWS = 5000
#: Pieces of one range at most (cuts sent with its query; width_bucket's array).
MAX_PIECES = 4096
#: Rows of a piece when the key is one integer column: its cuts are spaced evenly
#: in the key's values (see :func:`even_cuts`), as many as wanted without a bigger
#: sample, so pieces are smaller and a difference costs a rescan of fewer rows.
INT_PIECE_ROWS = 1000
INT_TYPES = ("smallint", "integer", "bigint")


def _pages(conn: Conn, t: VTable, est: int) -> int:
    """The source relation's pages (a tree compared at its root: about 50 rows a page)."""
    if not t.only:
        return max(1, est // 50)
    row = conn.execute(
        "SELECT pg_catalog.pg_relation_size(c.oid) / pg_catalog.current_setting('block_size')::int"
        " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s",
        t.src,
    ).fetchone()
    return max(1, int(row[0])) if row else max(1, est // 50)


def first_ranges(conn: Conn, t: VTable, chunk_rows: int) -> list[KeyRange]:
    """About ``rows / chunk_rows`` ranges, each cut in pieces of about ``PIECE_ROWS`` rows,
    from a sample of the source's keys.

    The sample is one key from each of about as many random pages as there
    are pieces (``TABLESAMPLE SYSTEM`` reads only those pages): the keys of
    one page are often neighbours (a table loaded in key order), so keys
    taken from fewer pages would leave long stretches without a cut.
    """
    if not t.key:
        return [KeyRange()]
    est = t.est_rows if t.est_rows > 0 else _row_count(conn, t)
    n = max(1, math.ceil(est / chunk_rows))
    pieces = min(n * MAX_PIECES, math.ceil(est / PIECE_ROWS))
    if pieces <= 1:
        return [KeyRange()]
    # A few keys a range at least, so that the ranges' own bounds are fair quantiles.
    pct = min(100.0, 100.0 * max(pieces, 4 * n) / _pages(conn, t, est))
    block = sql.SQL("(r.ctid::text::point)[0]")
    rows = conn.execute(
        # ORDER BY s.k: a bare k would name the text output column (text order).
        sql.SQL(
            "SELECT {kt} FROM (SELECT DISTINCT ON ({blk}) {kr} FROM {rel} AS r "
            "TABLESAMPLE SYSTEM (%s) ORDER BY {blk}, {kr}) s ORDER BY {ks}"
        ).format(
            kt=key_text(t),
            blk=block,
            kr=key_order(t, "r"),
            rel=relation(t, "source"),
            ks=key_order(t, "s"),
        ),
        (pct,),
    ).fetchall()
    keys = [tuple(r) for r in rows]
    ranges = ranges_from_keys(t, keys, n)
    if len(t.key) == 1 and t.key_types[0] in INT_TYPES and len(keys) > 1:
        per_key = est / len(keys)  # rows each sampled key stands for
        return [even_cuts(r, [int(k[0]) for k in keys], per_key) for r in ranges]
    return ranges


def even_cuts(rng: KeyRange, keys: list[int], per_key: float) -> KeyRange:
    """``rng`` (of a one-column integer key) cut every ``step`` values for pieces of
    about ``INT_PIECE_ROWS`` rows, instead of at its sampled keys.

    The sampled keys inside it (``keys``: the whole sorted sample) tell how
    many rows it holds and, for an open first or last range, where its keys
    start or end; between its bounds the keys are taken as evenly spread (a
    sequence's, a loaded range's). Uneven keys only make uneven pieces: every
    key still falls in exactly one.
    """
    lo = None if rng.lo is None else int(rng.lo[0])
    hi = None if rng.hi is None else int(rng.hi[0])
    inside = [k for k in keys if (lo is None or k >= lo) and (hi is None or k < hi)]
    if not inside:
        return rng
    a = inside[0] if lo is None else lo
    b = inside[-1] + 1 if hi is None else hi
    pieces = min(MAX_PIECES, max(1, round(len(inside) * per_key / INT_PIECE_ROWS)))
    step = max(1, -(-(b - a) // pieces))
    cuts = tuple((str(c),) for c in range(a + step, b, step))
    return KeyRange(rng.lo, rng.hi, cuts)


def ranges_from_keys(
    t: VTable, keys: list[Bound], n: int, base: KeyRange = KeyRange()
) -> list[KeyRange]:
    """Cut ``base`` at ``n - 1`` of the sorted ``keys`` (evenly spaced, distinct); the
    keys inside each range are its cuts."""
    if len(keys) < 1:
        return [base]
    if n <= 1 or len(keys) < 2:
        return [KeyRange(base.lo, base.hi, _inner(keys, base.lo, base.hi))]
    step = len(keys) / n
    cuts: list[Bound] = []
    for i in range(1, n):
        k = keys[min(int(i * step), len(keys) - 1)]
        if not cuts or cuts[-1] != k:
            cuts.append(k)
    if base.lo is not None and cuts and cuts[0] == base.lo:
        cuts = cuts[1:]  # an empty first range
    bounds: list[Bound | None] = [base.lo, *cuts, base.hi]
    return [KeyRange(lo, hi, _inner(keys, lo, hi)) for lo, hi in itertools.pairwise(bounds)]


def _inner(keys: list[Bound], lo: Bound | None, hi: Bound | None) -> tuple[Bound, ...]:
    """The distinct sampled keys strictly inside (lo, hi): the range's pieces.

    ``keys`` are the source's sorted key texts; their order is the key's order,
    so the ones between two cuts are a contiguous run of the list.
    """
    start = 0 if lo is None else keys.index(lo) + 1
    stop = len(keys) if hi is None else keys.index(hi)
    return tuple(dict.fromkeys(k for k in keys[start:stop] if k != lo and k != hi))


def bucket_of(t: VTable, cuts: list[Bound]) -> tuple[sql.Composable, list[Any]]:
    """``width_bucket(key, cuts)``: 0 below the first cut, i from cut i-1 to cut i.

    The pieces a range is cut into, told apart in one scan of the range.
    """
    one = sql.SQL("ROW({})").format(
        sql.SQL(", ").join(sql.SQL("%s::{}").format(sql.SQL(ty)) for ty in t.key_types)
    )
    arr = sql.SQL("ARRAY[{}]").format(sql.SQL(", ").join(one for _ in cuts))
    key = _key_row(t)
    if len(t.key) == 1:  # plain values: the key column's own comparison
        one = sql.SQL("%s::{}").format(sql.SQL(t.key_types[0]))
        arr = sql.SQL("ARRAY[{}]").format(sql.SQL(", ").join(one for _ in cuts))
        key = sql.Identifier(t.key[0])
    params = [v for cut in cuts for v in cut]
    return sql.SQL("width_bucket({}, {})").format(key, arr), params
