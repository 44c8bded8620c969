"""Pure unit tests of held DELETEs and FULL identity batches (no server)."""

from __future__ import annotations

from applier.apply.batching.fullident import MAX_FULL, FullHold
from applier.apply.batching.merge import AGAIN, UpdateMerger
from applier.apply.sql.mapping import RelMap, TargetColumn, TargetTable, build
from applier.apply.sql.planner import Planner
from applier.protocol import Column, Delete, Relation, TupleData, Update

T = TupleData.text


class Ctx:
    def __init__(self, n: int) -> None:
        self.lsn = n
        self.n = n


def _rm(replident: str = "d", json: bool = False, **target: object) -> RelMap:
    key = 1 if replident == "d" else 0
    cols = (Column(key, "id", 23, -1), Column(0, "a", 23, -1), Column(0, "b", 25, -1))
    rel = Relation(None, 1, "s", "t", replident, cols)
    tcols = {
        "id": TargetColumn("id", 23, "integer", True, False),
        "a": TargetColumn("a", 23, "integer", True, False),
        "b": TargetColumn("b", 114 if json else 25, "json" if json else "text", not json, False),
    }
    uniq = (frozenset({"id"}),) if replident == "d" else ()
    kw: dict[str, object] = {"relkind": "r", "unique_sets": uniq} | target
    return build(rel, TargetTable(9, "s", "t", columns=tcols, **kw))  # type: ignore[arg-type]


def _del(*values: bytes | None) -> Delete:
    return Delete(None, 1, T(*values), "O")


def test_deletes_are_held_in_order_and_a_key_twice_sends_the_first() -> None:
    rm, m = _rm(), UpdateMerger(Planner())
    assert m.add_delete(rm, _del(b"1", None, None), Ctx(1)) == 1
    assert m.add_delete(rm, _del(b"2", None, None), Ctx(2)) == 2
    assert m.add_delete(rm, _del(b"1", None, None), Ctx(3)) == AGAIN
    ((stmt, params, fmts, ctx),) = m.take(rm.relation.oid)
    assert stmt.query.startswith(b'DELETE FROM ONLY "s"."t" AS "applier_t" USING (VALUES (1, $1)')
    assert stmt.query.endswith(b'RETURNING "applier_v".applier_o')
    assert params == [b"1", b"2"] and fmts is None and [c.n for c in ctx.ctxs] == [1, 2]


def test_one_kind_per_table_at_a_time() -> None:
    rm, m = _rm(), UpdateMerger(Planner())
    upd = Update(None, 1, None, None, T(b"1", b"5", b"x"))
    assert m.add(rm, upd, Ctx(1)) == 1
    assert m.add_delete(rm, _del(b"1", None, None), Ctx(2)) == AGAIN
    m.take(rm.relation.oid)
    assert m.add_delete(rm, _del(b"1", None, None), Ctx(2)) == 1
    assert m.add(rm, upd, Ctx(3)) == AGAIN


def test_full_batch_only_where_no_index_and_nothing_watches() -> None:
    assert _rm("f").full_batch and not _rm("f").merge
    assert not _rm("f", locatable=True).full_batch
    assert not _rm("f", observed=True).full_batch
    assert not _rm("f", unique_sets=(None,)).full_batch
    assert not _rm("f", relkind="p").full_batch
    assert not _rm("f", json=True).full_batch  # no ``=``: row by row, ::text
    assert not _rm("d").full_batch


def _fupd(old: TupleData, new: TupleData) -> Update:
    return Update(None, 1, old, "O", new)


def test_full_chain_and_kind_switch_send_the_held_first() -> None:
    h = FullHold(_rm("f"))
    assert h.add(_fupd(T(b"1", b"1", b"x"), T(b"1", b"2", b"x")), Ctx(1)) == 1
    assert h.add(_fupd(T(b"1", b"1", b"x"), T(b"1", b"3", b"x")), Ctx(2)) == 2  # a duplicate
    assert h.add(_fupd(T(b"1", b"2", b"x"), T(b"1", b"4", b"x")), Ctx(3)) == AGAIN  # chain
    assert h.add(_del(b"9", b"9", b"x"), Ctx(4)) == AGAIN  # a DELETE after UPDATEs


def test_full_nulls_compare_with_is_not_distinct_and_padding_matches_nothing() -> None:
    planner, h = Planner(), FullHold(_rm("f"))
    assert h.add(_del(b"1", None, b"x"), Ctx(1)) == 1
    assert h.add(_del(b"2", b"2", b"y"), Ctx(2)) == 2
    assert h.add(_del(b"3", b"3", None), Ctx(3)) == 3
    assert h.add(_del(None, b"4", None), Ctx(4)) == AGAIN  # would leave no ``=`` column
    ((stmt, params, fmts, ctxs),) = h.plan(planner)
    q = stmt.query.decode()
    assert '"applier_t"."id" = "applier_v"."o0"' in q
    assert '"applier_t"."a" IS NOT DISTINCT FROM "applier_v"."o1"' in q
    assert '"applier_t"."b" IS NOT DISTINCT FROM "applier_v"."o2"' in q
    assert q.startswith("WITH") and "DELETE FROM ONLY" in q
    assert len(params) == 4 * 3 and params[9:] == [None] * 3  # padded to 4 rows
    assert fmts is None and [c.n for c in ctxs] == [1, 2, 3]


def test_full_all_null_row_goes_alone_unpadded() -> None:
    h = FullHold(_rm("f"))
    assert h.add(_del(None, None, None), Ctx(1)) == 1
    assert h.add(_del(b"1", b"1", b"x"), Ctx(2)) == AGAIN
    ((stmt, params, _, _),) = h.plan(Planner())
    assert params == [None, None, None] and stmt.types == (23, 23, 25)


def test_full_hold_limit() -> None:
    h = FullHold(_rm("f"))
    for i in range(MAX_FULL):
        assert h.add(_del(str(i).encode(), b"1", b"x"), Ctx(i)) == i + 1
    assert h.add(_del(b"x", b"1", b"x"), Ctx(0)) == AGAIN
