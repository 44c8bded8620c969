"""The hashes ``applier verify`` computes inside the servers, and its snapshots.

Row hash
--------
Two forms, the first where it is exact:

* **By value** (``record_hash``): ``hash_record_extended(ROW(c1, c2, ...), 0)``
  (PostgreSQL 14+), each column hashed by its type's own hash function on
  its stored value, no text made: a third of the text form's CPU
  (bench/README-verify.md). Only where equal hashes mean equal text, i.e.
  for the types of :data:`VALUE_HASHED` (integers, text under a
  deterministic collation, bytea, uuid, dates and times, bool), the same
  type on both sides, and both servers computing it alike (checked at the
  start). A numeric, a float, an interval, a jsonb, an array or an enum
  hashes by *equality* (``1.0`` and ``1.00``, ``0`` and ``-0``, ``'1 day'``
  and ``'24 hours'`` alike; an enum by its OID, which differs between
  clusters): a table holding one is hashed by text. The record hash is a
  linear mix of its columns' hashes, so summed over rows it would fall
  apart into per-column sums (two rows swapping a value would go unseen):
  it is hashed once more (``hashint8extended``) before the sum.
* **By text**: ``hashtextextended(ROW(c1, c2, ...)::text, 0)`` when both
  servers compute it alike (checked at start: it depends on byte order),
  else the first 64 bits of ``md5``.

The columns are listed *by name* (the target may order them differently).
The text form is the record's output form, which prints each column with
its type's output function (as COPY does), a NULL as an empty field, an
empty string as ``""`` (and any value with blanks, commas, quotes or
parentheses quoted), so that NULL, ``''`` and ``'NULL'`` never hash alike.
The text forms depend on session settings, so every verify session pins
those of the bootstrap and the stream, as every connection applier opens
(:mod:`applier.pgconn`: UTF8, DateStyle ISO, IntervalStyle postgres,
extra_float_digits 3, TimeZone UTC): the same values print the same on
PostgreSQL 15 and 18.

Range hash
----------
``count(*)`` and ``sum(each row's 64-bit hash)``. A sum
does not depend on the order the rows are read in, so a range is one scan
(an index range scan or a sequential one, whatever the planner likes), with
no sort, no ``string_agg`` of the whole range in memory, and it runs in
parallel pieces. ``sum(bigint)`` accumulates in 128 bits (exact, no
overflow), and unlike XOR it does not cancel duplicated rows, which matters
for tables without a key. Two ranges that differ hash alike only if their
64-bit sums collide: about 2^-64.

Snapshots and WAL positions
---------------------------
A source range is hashed in its own ``REPEATABLE READ READ ONLY``
transaction whose first statement reads ``pg_current_wal_lsn()``: the
snapshot is taken when that statement starts, and the position is read just
after it, so every transaction the snapshot sees committed before that
position. The race: a transaction can commit between the two, so the
position may cover a few commits the snapshot does not see. The target,
compared once it has applied everything up to the position, may then hold
rows newer than the snapshot's: a false difference, never a missed one
(equal ranges stay equal). Such a range is simply rechecked in the next
round, under a new snapshot, and reported only if it differs every time.
The transaction ends right after the one range: the source never holds a
snapshot longer than one range needs (vacuum is not held back).

"Applied up to the position" is the target's replication origin progress
(``pg_replication_origin_progress``) at or past it, or the slot's
``confirmed_flush_lsn`` at or past it (an idle source moves only the latter:
a caught-up worker confirms the stream's position without applying
anything). The wait is bounded by ``[verify] catchup_timeout``; a range
still behind is hashed anyway and is then likely rechecked.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from .. import pgconn
from ..errors import PermanentError
from ..lsn import Lsn
from ..redact import redact_dsn
from .ranges import Bound, KeyRange, VTable, bucket_of, key_text, range_where, relation

Conn = psycopg.Connection[Any]


class VerifyError(PermanentError):
    """``applier verify`` could not complete (exit 3)."""


def connect(
    conninfo: str, side: pgconn.Side, statement_timeout: float, grouping: bool = False
) -> Conn:
    """An autocommit session, pinned (:mod:`applier.pgconn`), with the verify's own
    statement and lock timeouts; ``grouping``: for the hash queries (see :class:`Sides`)."""
    ms = str(int(statement_timeout * 1000))
    extra = {"statement_timeout": ms, "lock_timeout": ms}
    if grouping:
        extra["enable_sort"] = "off"
    try:
        # No server-side prepared statements: a generic plan of a range query
        # does not know how narrow the range is and may scan the whole table.
        conn: Conn = pgconn.connect(
            conninfo, side=side, purpose="applier-verify", prepare_threshold=None,
            extra=extra,
        )  # fmt: skip
    except psycopg.OperationalError as e:
        first = str(e).strip().splitlines()[-1] if str(e).strip() else "connection failed"
        raise VerifyError(
            f"cannot connect to the {side} ({redact_dsn(conninfo)}): {first}",
            hint=f"check [{side}] dsn and that the server is up",
        ) from None
    return conn


def row_text(t: VTable) -> sql.Composable:
    return sql.SQL("ROW({})::text").format(sql.SQL(", ").join(sql.Identifier(c) for c in t.columns))


@dataclass(frozen=True)
class RangeHash:
    rows: int
    digest: str  # the sum, as text


def row_hash(t: VTable) -> sql.Composable:
    """A row's 64-bit hash, as a bigint (see "Row hash")."""
    if t.record_hash:
        return sql.SQL("hashint8extended(hash_record_extended(ROW({}), 0), 0)").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in t.columns)
        )
    if t.fast_hash:
        return sql.SQL("hashtextextended({}, 0)").format(row_text(t))
    return sql.SQL("('x' || substr(md5({}), 1, 16))::bit(64)::bigint").format(row_text(t))


def same_fast_hash(src: Conn, tgt: Conn) -> bool:
    """Whether both servers compute hashtextextended alike (same byte order, PG11+)."""
    probe = "SELECT hashtextextended('applier verify: (1,\"a b\",)', 0)::text"
    try:
        a, b = src.execute(probe).fetchone(), tgt.execute(probe).fetchone()
    except psycopg.Error:
        return False
    return a is not None and a == b


#: Types hashed by value (see "Row hash"): their hash function hashes the stored
#: value, which prints one way only, and is the same on every PostgreSQL since 14
#: (hash partitioning relies on it). text and varchar only under a deterministic
#: collation (checked per column).
VALUE_HASHED = {
    "bigint", "integer", "smallint", "oid", "boolean", '"char"', "name", "text",
    "character varying", "bytea", "uuid", "date", "time without time zone",
    "timestamp without time zone", "timestamp with time zone",
}  # fmt: skip

#: One value of each type of VALUE_HASHED (and a NULL): both servers must hash it alike.
_RECORD_PROBE = (
    "SELECT hash_record_extended(ROW(1::bigint, 2::integer, 3::smallint, 4::oid, true, "
    "'c'::\"char\", 'n'::name, 'a b'::text, 'v'::varchar, '\\x0102'::bytea, "
    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, '2024-01-02'::date, '01:02:03.5'::time, "
    "'2024-01-02 03:04:05.6'::timestamp, '2024-01-02 03:04:05.6+00'::timestamptz, "
    "NULL::text), 0)::text"
)


def same_record_hash(src: Conn, tgt: Conn) -> bool:
    """Whether both servers have hash_record_extended (14+) and hash alike with it."""
    try:
        a, b = src.execute(_RECORD_PROBE).fetchone(), tgt.execute(_RECORD_PROBE).fetchone()
    except psycopg.Error:
        return False
    return a is not None and a == b


def _column_kinds(conn: Conn, rel: tuple[str, str], columns: tuple[str, ...]) -> dict[str, Any]:
    """(type, deterministic collation) of each of ``columns``."""
    rows = conn.execute(
        "SELECT a.attname, pg_catalog.format_type(a.atttypid, NULL), "
        "  coalesce(co.collisdeterministic, true), t.typtype "
        "FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid "
        "LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation "
        "WHERE a.attrelid = pg_catalog.format('%%I.%%I', %s::text, %s::text)::regclass "
        "  AND a.attname = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped",
        (rel[0], rel[1], list(columns)),
    ).fetchall()
    return {r[0]: (r[1], bool(r[2]), r[3]) for r in rows}


def value_hashed(src: Conn, tgt: Conn, t: VTable) -> bool:
    """Whether every column of ``t`` may be hashed by value: a type of VALUE_HASHED
    (a base type, not a domain or enum), the same on both sides, a deterministic
    collation on both."""
    a, b = _column_kinds(src, t.src, t.columns), _column_kinds(tgt, t.dst, t.columns)
    for col in t.columns:
        ka, kb = a.get(col), b.get(col)
        if ka is None or ka != kb or ka[0] not in VALUE_HASHED or not ka[1] or ka[2] != "b":
            return False
    return True


def hash_query(t: VTable, side: str, rng: KeyRange) -> tuple[sql.Composed, list[Any]]:
    where, params = range_where(t, rng)
    q = sql.SQL("SELECT count(*), coalesce(sum({rh}), 0)::text FROM {rel} WHERE {where}").format(
        rh=row_hash(t), rel=relation(t, side), where=where
    )
    return q, params


def pieces_query(
    t: VTable, side: str, rng: KeyRange, cuts: list[Bound]
) -> tuple[sql.Composed, list[Any]]:
    """The hash of each piece of ``rng`` cut at ``cuts``, in one scan (grouped by
    ``width_bucket``: a hash table of the pieces, see :class:`Sides` for why not a sort).

    The previous form grouped on ``width_bucket`` through a ``LATERAL
    unnest(ARRAY[...])`` (a function scan hides the expression's estimate, so
    the planner used parallel workers); that function scan, run once a row,
    cost more than the row's hash itself (2.5 against 1.0 us a row, one
    backend, bench/README-verify.md).
    """
    bucket, b_params = bucket_of(t, cuts)
    where, params = range_where(t, rng)
    q = sql.SQL(
        "SELECT {b}, count(*), coalesce(sum({rh}), 0)::text FROM {rel} WHERE {where} GROUP BY 1"
    ).format(b=bucket, rh=row_hash(t), rel=relation(t, side), where=where)
    return q, [*b_params, *params]


def ident_hash(t: VTable) -> sql.Composable:
    """A 64-bit hash of what names a row: its key's text (keyed), else the row's own hash.

    Both sides compute it alike, so it buckets the same row into the same
    bucket on each side whatever else either side holds (see :mod:`.task`).
    """
    if not t.key:
        return row_hash(t)
    if t.record_hash:  # the key's columns are among the row's, hashed by value too
        return sql.SQL("hash_record_extended(ROW({}), 0)").format(
            sql.SQL(", ").join(sql.Identifier(k) for k in t.key)
        )
    text = sql.SQL("ROW({})::text").format(sql.SQL(", ").join(sql.Identifier(k) for k in t.key))
    if t.fast_hash:
        return sql.SQL("hashtextextended({}, 0)").format(text)
    return sql.SQL("('x' || substr(md5({}), 1, 16))::bit(64)::bigint").format(text)


def bucket(t: VTable, modulus: int) -> sql.Composable:
    """The row's bucket, 0 .. modulus - 1 (``mod`` keeps the dividend's sign)."""
    m = sql.Literal(modulus)
    return sql.SQL("mod(mod({h}, {m}) + {m}, {m})").format(h=ident_hash(t), m=m)


def in_buckets(
    t: VTable, where: sql.Composable, params: list[Any], modulus: int, buckets: list[int]
) -> tuple[sql.Composable, list[Any]]:
    """``where``, narrowed to the rows in these buckets of ``modulus`` (1: all of them)."""
    if modulus == 1:
        return where, params
    cond = sql.SQL("({}) AND {} = ANY(%s::bigint[])").format(where, bucket(t, modulus))
    return cond, [*params, buckets]


def buckets_query(
    t: VTable, side: str, where: sql.Composable, params: list[Any], modulus: int
) -> tuple[sql.Composed, list[Any]]:
    """The hash of each bucket of ``modulus`` under ``where``, in one scan."""
    q = sql.SQL(
        "SELECT {b}, count(*), coalesce(sum({rh}), 0)::text FROM {rel} WHERE {where} GROUP BY 1"
    ).format(b=bucket(t, modulus), rh=row_hash(t), rel=relation(t, side), where=where)
    return q, params


def pairs_query(
    t: VTable, side: str, where: sql.Composable, params: list[Any]
) -> tuple[sql.Composed, list[Any]]:
    """(key texts, row hash) of each row (keyed); (row hash, count) (no key). No row data."""
    rel = relation(t, side)
    if t.key:
        q = sql.SQL("SELECT ARRAY[{}], {} FROM {} WHERE {}").format(
            key_text(t), row_hash(t), rel, where
        )
    else:
        q = sql.SQL("SELECT {}::text, count(*) FROM {} WHERE {} GROUP BY 1").format(
            row_hash(t), rel, where
        )
    return q, params


def rows_query(
    t: VTable, side: str, where: sql.Composable, params: list[Any]
) -> tuple[sql.Composed, list[Any]]:
    """Key texts, row hash and the row as jsonb (keyed); row hash, count, one row (no key)."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in t.columns)
    inner = sql.SQL("SELECT {} FROM {} WHERE {}").format(cols, relation(t, side), where)
    if t.key:
        q = sql.SQL("SELECT ARRAY[{kt}], {rh}::text, to_jsonb(x) FROM ({inner}) x").format(
            kt=key_text(t), rh=row_hash(t), inner=inner
        )
    else:
        q = sql.SQL(
            "SELECT {rh}::text AS h, count(*), min(to_jsonb(x)::text)::jsonb FROM ({inner}) x "
            "GROUP BY 1"
        ).format(rh=row_hash(t), inner=inner)
    return q, params


def keys_where(t: VTable, keys: list[Bound]) -> tuple[sql.Composable, list[Any]]:
    """The rows of these keys (or, without a key, of these row hashes)."""
    if not t.key:
        cond = sql.SQL("{}::text = ANY(%s::text[])").format(row_hash(t))
        if t.row_filter:
            cond = sql.SQL("{} AND ({})").format(cond, sql.SQL(t.row_filter))
        return cond, [[k[0] for k in keys]]
    arrays = sql.SQL(", ").join(
        sql.SQL("%s::text[]::{}[]").format(sql.SQL(ty)) for ty in t.key_types
    )
    cond = sql.SQL("ROW({}) IN (SELECT * FROM unnest({}))").format(
        sql.SQL(", ").join(sql.Identifier(k) for k in t.key), arrays
    )
    params: list[Any] = [[k[i] for k in keys] for i in range(len(t.key))]
    if t.row_filter:
        cond = sql.SQL("{} AND ({})").format(cond, sql.SQL(t.row_filter))
    return cond, params


@dataclass
class Catchup:
    """How a task waits for the target to apply up to a source position."""

    origin: str
    slot: str
    wait: bool  # False: no worker streams (nothing would move): compare as is
    timeout: float


class Sides:
    """One source and one target session, and the snapshot discipline around them.

    The source and the target query of a range run at the same time (the
    source's in a thread): each server works on its own half. The catch-up
    wait asks the source's slot on a third session, as the first one is busy.

    The two sessions run with ``enable_sort`` off: every grouped query here
    (pieces, buckets) has a few hundred groups of many rows, but the planner
    estimates its groups from the key's own statistics (one group a row), and
    then sorts every row of the range by its piece, in parallel workers, rather
    than keep a hash table of the few groups (a sort of a million rows against
    a lookup a row). Nothing here needs a sort otherwise.
    """

    def __init__(self, src_dsn: str, tgt_dsn: str, catchup: Catchup, timeout: float) -> None:
        self.src = connect(src_dsn, "source", timeout, grouping=True)
        self.tgt = connect(tgt_dsn, "target", timeout, grouping=True)
        self._probe_dsn, self._timeout = src_dsn, timeout
        self._probe: Conn | None = None
        self.catchup = catchup
        self.lagging = 0  # waits that ran out
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="verify-source")

    def close(self) -> None:
        self._pool.shutdown()
        for conn in (self.src, self.tgt, self._probe):
            if conn is not None:
                conn.close()

    def both(
        self, q_src: sql.Composed, q_tgt: sql.Composed, params: list[Any]
    ) -> tuple[list[Any], list[Any]]:
        """A query on the source under a fresh snapshot, and on the target once caught up."""
        self.src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            row = self.src.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            assert row is not None
            running = self._pool.submit(lambda: self.src.execute(q_src, params).fetchall())
            try:
                self._wait_for(Lsn.parse(row[0]))
                tgt_rows = self.tgt.execute(q_tgt, params).fetchall()
            finally:
                src_rows = running.result()
        finally:
            self.src.execute("COMMIT")
        return src_rows, tgt_rows

    def hashes(self, t: VTable, rng: KeyRange) -> tuple[RangeHash, RangeHash]:
        """The range's hash on each side."""
        q_s, params = hash_query(t, "source", rng)
        q_t, _ = hash_query(t, "target", rng)
        s, d = self.both(q_s, q_t, params)
        return RangeHash(int(s[0][0]), s[0][1]), RangeHash(int(d[0][0]), d[0][1])

    def piece_hashes(
        self, t: VTable, rng: KeyRange, cuts: list[Bound]
    ) -> list[tuple[RangeHash, RangeHash]]:
        """The hashes of the ``len(cuts) + 1`` pieces of ``rng`` on each side."""
        q_s, params = pieces_query(t, "source", rng, cuts)
        q_t, _ = pieces_query(t, "target", rng, cuts)
        s_rows, t_rows = self.both(q_s, q_t, params)
        empty = RangeHash(0, "0")
        src = {int(r[0]): RangeHash(int(r[1]), r[2]) for r in s_rows}
        dst = {int(r[0]): RangeHash(int(r[1]), r[2]) for r in t_rows}
        return [(src.get(i, empty), dst.get(i, empty)) for i in range(len(cuts) + 1)]

    def bucket_hashes(
        self, t: VTable, where: sql.Composable, params: list[Any], modulus: int
    ) -> dict[int, tuple[RangeHash, RangeHash]]:
        """The hashes of the buckets of ``modulus`` under ``where`` on each side (both
        sides' buckets: a bucket one side lacks is empty there)."""
        q_s, _ = buckets_query(t, "source", where, params, modulus)
        q_t, _ = buckets_query(t, "target", where, params, modulus)
        s_rows, t_rows = self.both(q_s, q_t, params)
        empty = RangeHash(0, "0")
        src = {int(r[0]): RangeHash(int(r[1]), r[2]) for r in s_rows}
        dst = {int(r[0]): RangeHash(int(r[1]), r[2]) for r in t_rows}
        return {b: (src.get(b, empty), dst.get(b, empty)) for b in src.keys() | dst.keys()}

    def rows(
        self, t: VTable, where: sql.Composable, params: list[Any]
    ) -> tuple[list[Any], list[Any]]:
        """The rows under ``where`` on each side (see :func:`rows_query`)."""
        q_s, _ = rows_query(t, "source", where, params)
        q_t, _ = rows_query(t, "target", where, params)
        return self.both(q_s, q_t, params)

    def pairs(
        self, t: VTable, where: sql.Composable, params: list[Any]
    ) -> tuple[list[Any], list[Any]]:
        """(key, row hash) under ``where`` on each side (see :func:`pairs_query`)."""
        q_s, _ = pairs_query(t, "source", where, params)
        q_t, _ = pairs_query(t, "target", where, params)
        return self.both(q_s, q_t, params)

    def _wait_for(self, lsn: Lsn) -> None:
        c = self.catchup
        if not c.wait:
            return
        deadline = time.monotonic() + c.timeout
        while True:
            row = self.tgt.execute(
                "SELECT pg_replication_origin_progress(%s, true)::text", (c.origin,)
            ).fetchone()
            if row and row[0] and Lsn.parse(row[0]) >= lsn:
                return
            if self._probe is None:
                self._probe = connect(self._probe_dsn, "source", self._timeout)
            row = self._probe.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (c.slot,),
            ).fetchone()
            if row and row[0] and Lsn.parse(row[0]) >= lsn:
                return
            if time.monotonic() >= deadline:
                self.lagging += 1
                return
            time.sleep(0.02)
