"""How ``applier verify`` narrows a differing range down to its rows, on real servers.

A range is hashed per piece; the differing pieces are narrowed together by
buckets of a hash of the key, one query a level (``applier.verify.task``).
These tests put differences where an off-by-one would lose them: on a
range's or a piece's bounds, in the first and the last bucket, in composite
and quoted keys; and whole tables that differ in every row, hold one row,
or are empty on one side. Round 1 runs on the driver's threads here (no
Spark: a local master never starts it); one test runs the same on Spark
and compares.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Pair

from applier.verify import job, task
from applier.verify.hashing import Sides, connect
from applier.verify.ranges import INT_PIECE_ROWS, KeyRange, VTable, first_ranges
from verify.verifykit import NO_WAIT, NoSpark


class UpSpark:
    """A Spark already up (the tests' shared local context): ranges go to Spark at once."""

    def __init__(self, sc: Any) -> None:
        self.sc = sc

    def start(self) -> None:
        pass

    def ready(self) -> bool:
        return True

    def context(self) -> Any:
        return self.sc


def _table(name: str, key: tuple[str, ...], key_types: tuple[str, ...], cols: tuple[str, ...],
           fast: bool = True, record: bool = False) -> VTable:  # fmt: skip
    return VTable(("public", name), ("public", name), cols, key, key_types, fast_hash=fast,
                  record_hash=record)  # fmt: skip


@pytest.fixture
def sides(pair: Pair) -> Iterator[Sides]:
    s = Sides(pair.pub_dsn, pair.sub_dsn, NO_WAIT, 60.0)
    try:
        yield s
    finally:
        s.close()


def _named(res: task.RangeResult) -> set[int]:
    return {int(d.ident[0]) for d in res.diffs}


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # the hashes alike across versions
@pytest.mark.parametrize(
    ("fast", "record"), [(True, True), (True, False), (False, False)],
    ids=["hash_record_extended", "hashtextextended", "md5"],
)  # fmt: skip
def test_differences_on_range_and_piece_bounds(
    pair: Pair, sides: Sides, fast: bool, record: bool
) -> None:
    pair.both("CREATE TABLE edges (id bigint PRIMARY KEY, v text)")
    pair.both("INSERT INTO edges SELECT g, 'v' || g FROM generate_series(1, 3000) g")
    # The range [1000, 2000) cut at 1250, 1500, 1750: its own bounds, both
    # sides of a cut, the last key below hi; 2000 (hi) belongs to the next range.
    edge = [1000, 1249, 1250, 1749, 1750, 1999, 2000]
    pair.sub_exec(f"UPDATE edges SET v = 'changed' WHERE id IN ({','.join(map(str, edge))})")
    t = _table("edges", ("id",), ("bigint",), ("id", "v"), fast, record)
    cuts = (("1250",), ("1500",), ("1750",))
    rng = KeyRange(("1000",), ("2000",), cuts)
    res = task.run_range(sides, t, rng, 10, {"public.edges": 0})
    assert _named(res) == set(edge) - {2000}
    assert (res.rows, res.target_rows) == (1000, 1000)
    assert not res.truncated
    # The open first and last ranges: a key below every key and one above.
    pair.sub_exec("INSERT INTO edges VALUES (-5, 'below'), (9000, 'above')")
    pair.sub_exec("DELETE FROM edges WHERE id IN (1, 3000)")
    first = task.run_range(sides, t, KeyRange(None, ("1000",), (("500",),)), 10, {})
    last = task.run_range(sides, t, KeyRange(("2000",), None, (("2500",),)), 10, {})
    assert _named(first) == {-5, 1}
    assert _named(last) == {2000, 3000, 9000}
    by_key = {int(d.ident[0]): d for d in first.diffs + last.diffs}
    assert by_key[-5].source is None and by_key[-5].target == {"id": -5, "v": "below"}
    assert by_key[3000].source == {"id": 3000, "v": "v3000"} and by_key[3000].target is None


@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_differences_in_the_first_and_last_bucket(pair: Pair, sides: Sides) -> None:
    # 1000 differing rows in one piece, fetch_rows 100: one level of
    # ceil(1000 / BUCKET_ROWS) = 125 buckets, then the pairs of the differing ones.
    pair.both("CREATE TABLE b (id int PRIMARY KEY, v text)")
    pair.both("INSERT INTO b SELECT g, 'v' || g FROM generate_series(1, 1000) g")
    t = _table("b", ("id",), ("integer",), ("id", "v"))
    m = -(-1000 // task.BUCKET_ROWS)
    rows = pair.pub_exec(
        f"SELECT id, mod(mod(hashtextextended(ROW(id)::text, 0), {m}) + {m}, {m}) FROM b"
    )
    bucket = {int(i): int(b) for i, b in rows}
    first = min(i for i, b in bucket.items() if b == 0)
    last = max(i for i, b in bucket.items() if b == m - 1)
    negative = pair.pub_exec(
        f"SELECT min(id) FROM b WHERE hashtextextended(ROW(id)::text, 0) < 0 AND id NOT IN "
        f"({first}, {last})"
    )[0][0]
    pair.sub_exec(f"UPDATE b SET v = 'x' WHERE id IN ({first}, {last}, {negative})")
    res = task.run_range(sides, t, KeyRange(), 100, {})
    assert _named(res) == {first, last, negative}


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_whole_tables_composite_keys_every_row_one_row_empty_side(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair.both(
        "CREATE TABLE comp (a int, b text, v int, PRIMARY KEY (a, b));"
        "CREATE TABLE every (id int PRIMARY KEY, v text);"
        "CREATE TABLE one (id int PRIMARY KEY, v text);"
        "CREATE TABLE src_only (id int PRIMARY KEY, v text);"
        "CREATE TABLE tgt_only (id int PRIMARY KEY, v text);"
        "CREATE TABLE same (id int PRIMARY KEY, v text);"
        "CREATE TABLE many (id int PRIMARY KEY, v text);"
        # Keys whose text needs quoting in a ROW: blanks, commas, quotes, parentheses, ''.
        "INSERT INTO comp SELECT g % 50, (ARRAY['x, y', 'q\"uote', '(p)', '', 'plain'])[g % 5 + 1]"
        "  || (g / 50)::text, g FROM generate_series(0, 2499) g;"
        "INSERT INTO every SELECT g, 'v' || g FROM generate_series(1, 450) g;"
        "INSERT INTO one VALUES (1, 'only');"
        "INSERT INTO same SELECT g, 'v' FROM generate_series(1, 500) g;"
        "INSERT INTO many SELECT g, 'v' FROM generate_series(1, 1500) g;"
    )
    pair.pub_exec(
        "INSERT INTO src_only SELECT g, 'v' FROM generate_series(1, 300) g;"
        "CREATE PUBLICATION pub FOR ALL TABLES"
    )
    pair.sub_exec(
        "INSERT INTO tgt_only SELECT g, 'v' FROM generate_series(1, 200) g;"
        "UPDATE comp SET v = -1 WHERE (a, b) IN ((0, 'x, y0'), (1, 'q\"uote0'), (3, '3'),"
        "  (49, 'plain9'));"
        "INSERT INTO comp VALUES (0, 'x, y', 0);"  # a prefix of an existing key's text
        "UPDATE every SET v = v || '!';"
        "UPDATE one SET v = 'changed';"
        "UPDATE many SET v = 'w';"
    )
    # A table whose differing rows pass the budget (per task and table; two
    # driver threads here): named up to it, said to be truncated.
    monkeypatch.setattr(task, "MAX_DIFFS", 500)
    cfg = pair.config(verify={"fetch_rows": 50})
    report = job.verify(cfg, NoSpark(), patterns=None, chunk_rows=400, rounds=2)
    tables = {t.table: t for t in report.tables}
    comp = {d.ident: d for d in tables["public.comp"].differences}
    assert set(comp) == {("0", "x, y0"), ("1", 'q"uote0'), ("3", "3"), ("49", "plain9"),
                         ("0", "x, y")}  # fmt: skip
    assert comp[("0", "x, y")].key == {"a": 0, "b": "x, y"} and comp[("0", "x, y")].source is None
    assert comp[("3", "3")].source == {"a": 3, "b": "3", "v": 153}
    assert comp[("3", "3")].target == {"a": 3, "b": "3", "v": -1}
    assert {int(d.ident[0]) for d in tables["public.every"].differences} == set(range(1, 451))
    assert not tables["public.every"].truncated
    assert [(d.source, d.target) for d in tables["public.one"].differences] == [
        ({"id": 1, "v": "only"}, {"id": 1, "v": "changed"})
    ]
    src_only = tables["public.src_only"].differences
    assert len(src_only) == 300 and all(d.target is None for d in src_only)
    tgt_only = tables["public.tgt_only"].differences
    assert len(tgt_only) == 200 and all(d.source is None for d in tgt_only)
    assert tables["public.same"].differences == []
    many = tables["public.many"]
    assert many.truncated and 500 <= len(many.differences) < 1500
    assert not report.equal


@pytest.mark.spark
@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_spark_tasks_and_driver_threads_find_the_same_rows(pair: Pair, spark: Any) -> None:
    pair.both("CREATE TABLE big (id int PRIMARY KEY, v text); CREATE TABLE nokey (a int, b text)")
    pair.both(
        "INSERT INTO big SELECT g, 'v' || g FROM generate_series(1, 6000) g;"
        "INSERT INTO nokey SELECT g % 100, 'b' FROM generate_series(1, 3000) g"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.sub_exec(
        "UPDATE big SET v = 'x' WHERE id IN (1, 2999, 3000, 6000);"
        "DELETE FROM big WHERE id = 4500; INSERT INTO big VALUES (7000, 'extra');"
        "INSERT INTO nokey VALUES (5, 'b'); DELETE FROM nokey WHERE ctid = (SELECT min(ctid)"
        "  FROM nokey WHERE a = 7)"
    )
    # A cluster's master in the config (a local one never starts Spark), the
    # tests' local context as the Spark that is up.
    cfg = pair.config(verify={"fetch_rows": 20}, bootstrap={"spark_master": "spark://h:7077"})
    found = {}
    for name, spark_of in (("driver", NoSpark()), ("spark", UpSpark(spark))):
        report = job.verify(cfg, spark_of, patterns=None, chunk_rows=1000, rounds=1)
        found[name] = {
            t.table: sorted((d.ident, d.source_count, d.target_count) for d in t.differences)
            for t in report.tables
        }
    assert found["driver"] == found["spark"]
    assert [int(i[0]) for i, _, _ in found["driver"]["public.big"]] == sorted(
        [1, 2999, 3000, 6000, 4500, 7000]
    )
    assert sorted((s, t) for _, s, t in found["driver"]["public.nokey"]) == [(30, 29), (30, 31)]


@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_integer_key_pieces_cut_evenly_in_its_values(pair: Pair) -> None:
    # A one-column integer key is cut every `step` values (not at sampled keys):
    # keys far outside the sample (the type's ends), gaps and negative keys must
    # each still fall in exactly one piece, and be named when they differ.
    pair.both("CREATE TABLE ints (id bigint PRIMARY KEY, v text)")
    pair.both(
        "INSERT INTO ints SELECT g, 'v' FROM generate_series(1, 20000) g;"
        "INSERT INTO ints SELECT g * 1000, 'gap' FROM generate_series(30, 60) g;"
        "INSERT INTO ints VALUES (-9223372036854775808, 'min'), (-5, 'neg'),"
        " (9223372036854775807, 'max')"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES; ANALYZE ints")
    src = connect(pair.pub_dsn, "source", 60)
    try:
        t = _table("ints", ("id",), ("bigint",), ("id", "v"))
        ranges = first_ranges(src, t, 5000)
    finally:
        src.close()
    assert len(ranges) > 1 and ranges[0].lo is None and ranges[-1].hi is None
    for a, b in itertools.pairwise(ranges):
        assert a.hi == b.lo
    for r in ranges:
        bounds = [int(c[0]) for c in r.cuts]
        assert bounds == sorted(set(bounds))
        assert all((r.lo is None or int(r.lo[0]) < c) and (r.hi is None or c < int(r.hi[0]))
                   for c in bounds)  # fmt: skip
    # About one piece per INT_PIECE_ROWS rows: the row count is estimated from a
    # sample and rounded per range, so the exact count varies from run to run.
    pieces = sum(len(r.cuts) + 1 for r in ranges)
    assert 20000 // INT_PIECE_ROWS // 2 <= pieces <= 2 * 20000 // INT_PIECE_ROWS, pieces
    edge = [-9223372036854775808, -5, 1, 20000, 45000, 9223372036854775807]
    pair.sub_exec(f"UPDATE ints SET v = 'changed' WHERE id IN ({','.join(map(str, edge))})")
    pair.sub_exec("DELETE FROM ints WHERE id = 10000; INSERT INTO ints VALUES (25000, 'x')")
    report = job.verify(pair.config(), NoSpark(), patterns=None, chunk_rows=5000, rounds=1)
    named = {int(d.ident[0]) for t in report.tables for d in t.differences}
    assert named == {*edge, 10000, 25000}
