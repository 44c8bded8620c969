"""Pure unit tests of UPDATE merging and multi-row statements (no server)."""

from __future__ import annotations

from applier.apply.batching.merge import UpdateMerger
from applier.apply.sql.mapping import RelMap, TargetColumn, TargetTable, build
from applier.apply.sql.planner import Planner, insert_rows, max_rows
from applier.apply.sql.stmt import MAX_HELD, chunks
from applier.protocol import Column, Insert, Relation, TupleData, Update


class Ctx:
    def __init__(self, n: int) -> None:
        self.lsn = n
        self.n = n


def _rm(**target: object) -> RelMap:
    cols = (Column(1, "id", 23, -1), Column(0, "a", 23, -1), Column(0, "big", 25, -1))
    rel = Relation(None, 1, "s", "t", "d", cols)
    tcols = {
        "id": TargetColumn("id", 23, "integer", True, False),
        "a": TargetColumn("a", 23, "integer", True, False),
        "big": TargetColumn("big", 25, "text", True, False),
    }
    kw: dict[str, object] = {"relkind": "r", "unique_sets": (frozenset({"id"}),)} | target
    return build(rel, TargetTable(9, "s", "t", columns=tcols, **kw))  # type: ignore[arg-type]


def _upd(kinds: bytes, *values: bytes | None) -> Update:
    return Update(None, 1, None, None, TupleData(kinds, values))


def test_merge_only_where_nothing_can_tell_the_order() -> None:
    assert _rm().merge
    assert not _rm(observed=True).merge  # a replica/always trigger or rule
    assert not _rm(unique_sets=(frozenset({"id"}), frozenset({"a"}))).merge
    assert not _rm(unique_sets=(None,)).merge  # expression or partial unique index
    assert not _rm(relkind="p").merge
    assert not _rm(unique_sets=()).merge  # duplicates of a key would blur missing rows


def test_last_values_win_and_unchanged_toast_keeps_an_earlier_value() -> None:
    planner, rm = Planner(), _rm()
    m = UpdateMerger(planner)
    assert m.add(rm, _upd(b"ttt", b"1", b"10", b"x"), Ctx(1)) == 1
    assert m.add(rm, _upd(b"ttu", b"1", b"11", None), Ctx(2)) == 1  # big unchanged: keeps 'x'
    assert m.add(rm, _upd(b"ttu", b"2", b"20", None), Ctx(3)) == 2  # big never sent for key 2
    (s1, p1, f1, c1), (s2, p2, f2, c2) = m.take(rm.relation.oid)
    assert not m.tables
    assert b'SET "a" = "applier_v"."c0", "big" = "applier_v"."c1"' in s1.query
    assert p1 == [b"11", b"x", b"1"] and f1 is None and [c.n for c in c1.ctxs] == [2]
    assert b'"big"' not in s2.query.split(b"FROM")[0]  # left out of SET
    assert p2 == [b"20", b"2"] and f2 is None and [c.n for c in c2.ctxs] == [3]
    assert s2.query.endswith(b'RETURNING "applier_v".applier_o')


def test_key_changes_and_unsent_keys_are_not_held() -> None:
    rm = _rm()
    m = UpdateMerger(Planner())
    old = TupleData(b"tnn", (b"1", None, None))
    assert m.add(rm, Update(None, 1, old, "K", TupleData(b"ttt", (b"2", b"1", b"x"))), Ctx(1)) == 0
    assert m.add(rm, _upd(b"utt", None, b"1", b"x"), Ctx(2)) == 0
    assert not m.tables


def test_rows_go_in_power_of_two_chunks_with_binary_formats() -> None:
    rm = _rm()
    m = UpdateMerger(Planner())
    for k in range(100):
        m.add(rm, _upd(b"tbt", str(k).encode(), b"\0\0\0\1", b"v"), Ctx(k))
    batches = m.take_all()
    assert [len(b[3].ctxs) for b in batches] == [64, 32, 4]
    stmt, params, fmts, _ = batches[2]
    assert len(params) == 12 and fmts == bytes([1, 0, 0]) * 4
    assert stmt.types == (23, 25, 23) * 4


def test_chunks_and_parameter_limit() -> None:
    assert chunks(100, 64) == [64, 32, 4]
    assert chunks(600, MAX_HELD) == [256, 256, 64, 16, 8]
    assert chunks(1, 256) == [1]
    assert max_rows(3, 256) == 256
    assert max_rows(1000, 256) == 64  # 64 * 1000 params <= 65535
    assert max_rows(70000, 256) == 1


def test_multi_row_insert_numbers_parameters_per_row() -> None:
    stmt, _, _ = Planner().insert(_rm(), Insert(None, 1, TupleData.text(b"1", b"2", b"x")))
    many = insert_rows(stmt, 2)
    assert many.query == (
        b'INSERT INTO "s"."t" ("id", "a", "big") OVERRIDING SYSTEM VALUE VALUES '
        b"($1, $2, $3), ($4, $5, $6)"
    )
    assert many.types == stmt.types * 2 and many.name != stmt.name
