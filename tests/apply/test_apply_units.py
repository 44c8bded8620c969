"""Pure unit tests: planner statements, spool with subxact aborts, flush tracking."""

from __future__ import annotations

import gc
import time
from pathlib import Path

from applier.apply.gcsched import GC_INTERVAL, collect_garbage_on_schedule
from applier.apply.handlers.spool import SpoolSet
from applier.apply.handlers.streamed import subxact_of
from applier.apply.sql.mapping import RelMap, TargetColumn, TargetTable
from applier.apply.sql.planner import Planner
from applier.apply.target.origin import FLUSHED, FlushTracker
from applier.ddl.message import DdlMessage
from applier.lsn import Lsn
from applier.protocol import (
    Column,
    Delete,
    Insert,
    Message,
    Relation,
    StreamedChange,
    TupleData,
    Update,
    decode_streamed,
    encode,
)


def _rm(replident: str = "d", partitioned: bool = False) -> RelMap:
    cols = (Column(1, "id", 23, -1), Column(0, "j", 114, -1), Column(0, "big", 25, -1))
    rel = Relation(None, 1, "s", "t", replident, cols)
    tcols = {
        "id": TargetColumn("id", 23, "integer", True, False),
        "j": TargetColumn("j", 114, "json", False, False),
        "big": TargetColumn("big", 25, "text", True, False),
    }
    target = TargetTable(9, "s", "t", "p" if partitioned else "r", tcols)
    return RelMap(rel, 7, True, target, tuple(tcols.values()), (0,))


def test_insert_passes_bytes_through() -> None:
    stmt, params, fmts = Planner().insert(_rm(), Insert(None, 1, TupleData.text(b"1", b"{}", None)))
    assert stmt.query == (
        b'INSERT INTO "s"."t" ("id", "j", "big") OVERRIDING SYSTEM VALUE VALUES ($1, $2, $3)'
    )
    assert stmt.types == (23, 114, 25)
    assert params == [b"1", b"{}", None] and fmts is None


def test_inserts_differing_only_by_nulls_share_one_statement() -> None:
    """One prepared statement, and one COPY run, whether a value is NULL or not."""
    planner, rm = Planner(), _rm()
    a, _, _ = planner.insert(rm, Insert(None, 1, TupleData.text(b"1", b"{}", None)))
    b, _, _ = planner.insert(rm, Insert(None, 1, TupleData.text(b"2", b"{}", b"x")))
    assert a is b
    assert a.copy == b'COPY "s"."t" ("id", "j", "big") FROM STDIN'


def test_update_leaves_unchanged_toast_out_and_uses_old_key() -> None:
    new = TupleData(b"ttu", (b"2", b"{}", None))
    old = TupleData(b"tnn", (b"1", None, None))
    stmt, params, _ = Planner().update(_rm(), Update(None, 1, old, "K", new))
    assert stmt.query == b'UPDATE ONLY "s"."t" SET "id" = $1, "j" = $2 WHERE "id" = $3'
    assert params == [b"2", b"{}", b"1"]


def test_full_identity_one_row_text_compare_for_json() -> None:
    old = TupleData.text(b"1", b"{}", None)
    stmt, params, _ = Planner().delete(_rm("f"), Delete(None, 1, old, "O"))
    q = stmt.query.decode()
    assert "ctid = (SELECT ctid FROM" in q and "LIMIT 1" in q
    # ``=`` and IS NULL (an index can serve them; IS NOT DISTINCT FROM never).
    assert '"j"::pg_catalog.text = $2::pg_catalog.text AND "big" IS NULL' in q
    assert params == [b"1", b"{}", None]
    pstmt, _, _ = Planner().delete(_rm("f", partitioned=True), Delete(None, 1, old, "O"))
    assert b"tableoid" in pstmt.query


def test_truncate_options() -> None:
    q = Planner.truncate([_rm(), _rm(partitioned=True)], restart_identity=True)
    assert q == b'TRUNCATE ONLY "s"."t", "s"."t" RESTART IDENTITY RESTRICT'


def test_spool_subxact_abort_in_memory_and_on_disk(tmp_path: Path) -> None:
    for limit in (10**9, 1):
        spools = SpoolSet(tmp_path, "o", limit)
        sp = spools.open(100, True)
        ins = [Insert(x, 1, TupleData.text(str(i).encode())) for i, x in
               enumerate([100, 100, 101, 101, 102, 100])]  # fmt: skip
        for m in ins[:4]:
            spools.add(sp, encode(m, 2, in_stream=True), m.xid)
        spools.abort(100, 101)
        for m in ins[4:]:
            spools.add(sp, encode(m, 2, in_stream=True), m.xid)
        got = [decode_streamed(d) for d in sp]
        assert [m.new.values[0] for m in got] == [b"0", b"1", b"4", b"5"]  # type: ignore[union-attr]
        assert [m.xid for m in got] == [100, 100, 102, 100]  # type: ignore[union-attr]
        assert sp.on_disk == (limit == 1)
        spools.abort(100, 100)
        assert spools.get(100) is None and not list(tmp_path.glob("*.spool"))


def _ddl(top: int, sub: int | None, n: int) -> StreamedChange:
    """A captured statement in a stream block: pgoutput sends it with the top-level xid,
    the capture (version 2) writes its subtransaction's in the content."""
    content = DdlMessage("ALTER TABLE", f"ddl {n}", "public", (), subxact=sub).encode()
    data = encode(Message(top, True, Lsn(n), "applier.ddl", content), 2, in_stream=True)
    return StreamedChange(top, data)


def _row(xid: int, n: int) -> StreamedChange:
    return StreamedChange(xid, encode(Insert(xid, 1, TupleData.text(str(n).encode())), 2, True))


def test_spool_drops_the_ddl_of_a_rolled_back_savepoint(tmp_path: Path) -> None:
    """Top 100; savepoint S 101 with the capture's subtransaction C (102, 104, ...):
    rows then DDL, the DDL alone, DDL then rows, nested; Stream Aborts as PostgreSQL
    sends them (the children first). What stays is what the source kept."""
    cases = [
        ([_row(100, 1), _row(101, 2), _ddl(100, 102, 3), _row(101, 4)], [(102,), (101,)], ["1"]),
        ([_row(100, 1), _ddl(100, 102, 2)], [(102,), (101,)], ["1"]),
        ([_ddl(100, 102, 1), _row(101, 2), _row(100, 3)], [(102,), (101,)], []),
        ([_ddl(100, 102, 1), _ddl(100, 104, 2), _row(103, 3)], [(104,), (103,)], ["ddl 1"]),
        ([_ddl(100, None, 1), _row(100, 2)], [], ["ddl 1", "2"]),  # a version 1 capture
    ]
    for limit in (10**9, 1):
        for changes, aborts, kept in cases:
            spools = SpoolSet(tmp_path, "o", limit)
            sp = spools.open(100, True)
            for c in changes:
                spools.add(sp, c.data, subxact_of(c))
            for (sub,) in aborts:
                spools.abort(100, sub)
            got = [decode_streamed(d) for d in sp]
            said = [m.new.values[0].decode() if isinstance(m, Insert) else  # type: ignore[union-attr]
                    m.content.decode().split('"statement":"')[1].split('"')[0]  # type: ignore[union-attr]
                    for m in got]  # fmt: skip
            assert said == kept, (changes, aborts, said)
            spools.close()


def test_flush_tracker_waits_for_local_flush() -> None:
    ft = FlushTracker()
    ft.store(Lsn(100), Lsn(1000))
    ft.store(Lsn(200), FLUSHED)  # empty txn behind a pending one waits for it
    ft.store(Lsn(300), Lsn(3000))
    assert ft.release(Lsn(999)) == 0
    assert ft.release(Lsn(1000)) == 200
    assert ft.release(Lsn(5000)) == 300 and not ft.pending


def test_flush_tracker_pending_commit_holds_back_what_follows() -> None:
    ft = FlushTracker()
    entry = ft.store_pending(Lsn(100))  # sent, result not in yet
    ft.store(Lsn(200), FLUSHED)  # an empty transaction after it
    assert ft.release(Lsn(2**63)) == 0 and ft.pending
    ft.resolve(entry, Lsn(1000))
    assert ft.release(Lsn(999)) == 0
    assert ft.release(Lsn(1000)) == 200 and not ft.pending


def test_garbage_collected_on_schedule_and_collector_restored() -> None:
    phases: list[str] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        phases.append(phase)

    gc.callbacks.append(seen)
    try:
        assert gc.isenabled()
        with collect_garbage_on_schedule() as collect:
            assert not gc.isenabled()  # no collection by allocation count while applying
            collect(time.monotonic())  # the interval has not passed
            assert phases == []
            collect(time.monotonic() + GC_INTERVAL + 1)
            assert phases == ["start", "stop"]
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(seen)
