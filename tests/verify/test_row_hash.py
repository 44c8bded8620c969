"""Rows hashed by value (``hash_record_extended``) where that is exact, by text elsewhere.

Hashing each column by its type's hash function is a third of the text
form's CPU, but a type's hash follows its *equality*: ``1.0`` and ``1.00``,
``0`` and ``-0``, ``'1 day'`` and ``'24 hours'`` hash alike, an enum by its
OID (which differs between clusters). These tests hold that only the types
whose equal values print alike are hashed by value, that such a table still
shows every difference (on 15 -> 18: both versions hash alike), and that the
other types keep the text form, which tells ``1.0`` from ``1.00``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import Pair

from applier.verify import job, task
from applier.verify.hashing import Conn, Sides, connect, same_record_hash, value_hashed
from applier.verify.ranges import KeyRange, VTable
from verify.verifykit import NO_WAIT, NoSpark


def _table(name: str, key: tuple[str, ...], key_types: tuple[str, ...], cols: tuple[str, ...],
           record: bool = False) -> VTable:  # fmt: skip
    return VTable(("public", name), ("public", name), cols, key, key_types, fast_hash=True,
                  record_hash=record)  # fmt: skip


SAFE = (
    'id bigint PRIMARY KEY, i int, s smallint, o oid, b boolean, c "char", n name, t text,'
    " vc varchar(20), bt bytea, u uuid, d date, tm time, ts timestamp, tz timestamptz"
)
SAFE_ROW = (
    "g, g * 7, (g % 100)::smallint, g::oid, g % 2 = 0, 'c', 'n' || g, 'text ' || g,"
    " 'vc' || g, ('\\x' || lpad(to_hex(g), 8, '0'))::bytea,"
    " md5(g::text)::uuid, '2024-01-01'::date + g, '00:00:01.5'::time + g * interval '1 s',"
    " '2024-01-01 00:00:00.25'::timestamp + g * interval '1 min',"
    " '2024-01-01 00:00:00.5+02'::timestamptz + g * interval '1 h'"
)


@pytest.fixture
def conns(pair: Pair) -> Iterator[tuple[Conn, Conn]]:
    src, tgt = connect(pair.pub_dsn, "source", 60), connect(pair.sub_dsn, "target", 60)
    try:
        yield src, tgt
    finally:
        src.close()
        tgt.close()


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_by_value_only_where_equal_values_print_alike(pair: Pair, conns: tuple[Conn, Conn]) -> None:
    src, tgt = conns
    assert same_record_hash(src, tgt)
    pair.both(
        f"CREATE TABLE safe ({SAFE}); CREATE TYPE colour AS ENUM ('red', 'blue');"
        "CREATE DOMAIN posint AS int CHECK (VALUE > 0);"
        "CREATE TABLE num (id int PRIMARY KEY, v numeric); CREATE TABLE flt (id int, v float8);"
        "CREATE TABLE ivl (id int, v interval); CREATE TABLE js (id int, v jsonb);"
        "CREATE TABLE arr (id int, v int[]); CREATE TABLE en (id int, v colour);"
        "CREATE TABLE dom (id int, v posint); CREATE TABLE chr (id int, v char(3))"
    )
    # The same column, a different type on the target; a non-deterministic collation.
    pair.pub_exec(
        "CREATE TABLE widened (id int, v int);"
        "CREATE COLLATION nocase (provider = icu, locale = 'und-u-ks-level2',"
        "  deterministic = false);"
        "CREATE TABLE ci (id int, v text COLLATE nocase)"
    )
    pair.sub_exec("CREATE TABLE widened (id int, v bigint); CREATE TABLE ci (id int, v text)")
    cols = {"safe": tuple(c.split()[0] for c in SAFE.split(","))}

    def by_value(name: str) -> bool:
        t = _table(name, (), (), cols.get(name, ("id", "v")), record=True)
        return value_hashed(src, tgt, t)

    assert by_value("safe")
    for name in ("num", "flt", "ivl", "js", "arr", "en", "dom", "chr", "widened", "ci"):
        assert not by_value(name), name


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_by_value_finds_a_difference_in_each_column_and_swapped_values(pair: Pair) -> None:
    pair.both(
        f"CREATE TABLE safe ({SAFE}); INSERT INTO safe SELECT {SAFE_ROW}"
        " FROM generate_series(1, 3000) g;"
        "CREATE TABLE num (id int PRIMARY KEY, v numeric);"
        "INSERT INTO num SELECT g, g FROM generate_series(1, 100) g"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    # One column changed in each of 15 rows (one row per column), and two
    # rows that swap their texts: the sums of each column's hashes stay the
    # same, the rows do not.
    changes = [
        "i = i + 1", "s = s + 1", "o = (o::bigint + 1)::oid", "b = NOT b",
        "c = 'd'", "n = n || '!'",
        "t = t || '!'", "vc = vc || '!'", "bt = bt || '\\x00'::bytea",
        "u = md5('other')::uuid", "d = d + 1", "tm = tm + interval '1 us'",
        "ts = ts + interval '1 us'", "tz = tz + interval '1 us'", "id = id + 100000",
    ]  # fmt: skip
    changed = [100 * (i + 1) for i in range(len(changes))]
    updates = [f"UPDATE safe SET {c} WHERE id = {k}" for c, k in zip(changes, changed, strict=True)]
    pair.sub_exec(
        ";".join(updates)
        + ";UPDATE safe SET t = CASE id WHEN 2001 THEN 'text 2002' ELSE 'text 2001' END"
        " WHERE id IN (2001, 2002)"
        ";UPDATE num SET v = v::numeric(10, 2) WHERE id = 7"  # 7 -> 7.00: equal, not alike
    )
    report = job.verify(pair.config(), NoSpark(), patterns=None, chunk_rows=1000, rounds=2)
    tables = {t.table: t for t in report.tables}
    found = {int(d.ident[0]) for d in tables["public.safe"].differences}
    assert found == {*changed, 1500 + 100000, 2001, 2002}  # the moved key: gone and new
    assert [int(d.ident[0]) for d in tables["public.num"].differences] == [7]
    # The table of safe types was hashed by value (the numeric one by text).
    src, tgt = connect(pair.pub_dsn, "source", 60), connect(pair.sub_dsn, "target", 60)
    try:
        safe_cols = tuple(c.split()[0] for c in SAFE.split(","))
        assert value_hashed(src, tgt, _table("safe", ("id",), ("bigint",), safe_cols))
        assert not value_hashed(src, tgt, _table("num", ("id",), ("integer",), ("id", "v")))
    finally:
        src.close()
        tgt.close()


@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_values_swapped_inside_one_piece(pair: Pair) -> None:
    # The record hash is linear in its columns' hashes: summed over a piece, a
    # swap of one column's values between two rows would cancel out if the
    # row hash were not hashed again before the sum.
    pair.both("CREATE TABLE sw (id int PRIMARY KEY, a int, b text)")
    pair.both("INSERT INTO sw SELECT g, g, 'b' || g FROM generate_series(1, 2000) g")
    pair.sub_exec(
        "UPDATE sw SET a = CASE id WHEN 10 THEN 11 ELSE 10 END WHERE id IN (10, 11);"
        "UPDATE sw SET b = CASE id WHEN 500 THEN 'b1500' ELSE 'b500' END WHERE id IN (500, 1500)"
    )
    t = _table("sw", ("id",), ("integer",), ("id", "a", "b"), record=True)
    sides = Sides(pair.pub_dsn, pair.sub_dsn, NO_WAIT, 60.0)
    try:
        # One piece (no cuts): each swap stays inside the range's single hash.
        res = task.run_range(sides, t, KeyRange(), 20, {})
    finally:
        sides.close()
    assert {int(d.ident[0]) for d in res.diffs} == {10, 11, 500, 1500}
