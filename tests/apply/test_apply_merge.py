"""UPDATEs merged per key and short INSERT runs as multi-row INSERTs, on real servers.

Each test would fail if the thing it names broke: the final state differs, a
trigger on the target sees fewer changes than the source made, an extra unique
index makes the merged statement fail, or an error names a span of changes
instead of the change that failed.
"""

from __future__ import annotations

import pytest
from applykit import Runner, origin_lsn, wait_equal, wait_for
from conftest import ONE_PAIR, Pair

DDL = """
CREATE TABLE acc (id int PRIMARY KEY, bal int, note text, big text);
ALTER TABLE acc ALTER big SET STORAGE EXTERNAL;
CREATE TABLE two (a int, b text, v int, PRIMARY KEY (a, b));
CREATE TABLE hist (n int, v text);
INSERT INTO acc SELECT g, 0, 'n' || g, repeat('x', 5000) || g FROM generate_series(1, 50) g;
INSERT INTO two SELECT g, 'k' || g, 0 FROM generate_series(1, 10) g;
"""

#: One transaction mixing everything merging must keep apart: unchanged TOAST
#: values (big, stored out of line), a key change, delete + re-insert of a key,
#: inserts between the updates, a composite key.
BIG_TXN = """
DO $$ BEGIN
  FOR i IN 1..20 LOOP
    UPDATE acc SET bal = bal + i WHERE id % 5 = 0;
    UPDATE two SET v = v + i WHERE a <= 3;
    INSERT INTO hist VALUES (i, 'h' || i);
    IF i = 7 THEN UPDATE acc SET big = repeat('y', 6000) || i WHERE id = 10; END IF;
  END LOOP;
  UPDATE acc SET id = 1015 WHERE id = 15;
  UPDATE acc SET bal = -15 WHERE id = 1015;
  DELETE FROM acc WHERE id = 20;
  INSERT INTO acc VALUES (20, 20, 'again', NULL);
  UPDATE acc SET note = 'after' WHERE id = 20;
  UPDATE two SET b = 'moved' WHERE a = 2;
  UPDATE two SET v = 99 WHERE a = 2;
END $$
"""


def _backlog(pair: Pair, cfg: object, workload: list[str]) -> Runner:
    """Run ``workload`` while no worker runs, so the worker finds it all in hand (groups)."""
    runner = Runner(pair, cfg).start().ready()  # type: ignore[arg-type]
    assert runner.stop() == 0
    for sql in workload:
        pair.pub_exec(sql)
    return Runner(pair, cfg, "applier2.log").start()  # type: ignore[arg-type]


def _updates(pair: Pair, table: str) -> int:
    """Rows the target's backends updated in ``table`` (cumulative statistics)."""
    rows = pair.sub_exec(f"SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = '{table}'")
    return int(rows[0][0])


@pytest.mark.parametrize("binary", [False, True])
@ONE_PAIR
def test_merged_updates_reach_the_source_state(pair: Pair, binary: bool) -> None:
    pair.both(DDL)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"binary": binary})
    small = (
        "DO $$ BEGIN FOR i IN 1..300 LOOP "
        "UPDATE acc SET bal = bal + 1 WHERE id = 1; COMMIT; END LOOP; END $$"
    )
    runner = _backlog(pair, cfg, [BIG_TXN, small])
    wait_equal(pair, ["acc", "two", "hist"], runner=runner, timeout=90)
    assert runner.stop() == 0  # the backend exits: its statistics are flushed
    # 200 UPDATEs of 10 rows in the big transaction and 300 of one row in groups of
    # up to 100: unmerged that is more than 500 row updates on the target.
    wait_for(lambda: _updates(pair, "acc") > 0, 10, "statistics")
    assert _updates(pair, "acc") < 250
    assert "one by one" not in runner.log()


@ONE_PAIR
def test_merging_keeps_out_of_tables_where_the_order_shows(pair: Pair) -> None:
    pair.both(
        "CREATE TABLE uq (id int PRIMARY KEY, u int); INSERT INTO uq VALUES (1, 1), (2, 2);"
        "CREATE TABLE watched (id int PRIMARY KEY, v int); INSERT INTO watched VALUES (1, 0);"
    )
    # Target only: a unique index the intermediate states respect but a merged
    # statement would not, and a trigger that must see every change.
    pair.sub_exec(
        "CREATE UNIQUE INDEX ON uq (u);"
        "CREATE TABLE audit (v int);"
        "CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN INSERT INTO public.audit VALUES (NEW.v); RETURN NEW; END $$;"
        "CREATE TRIGGER a AFTER UPDATE ON watched FOR EACH ROW EXECUTE FUNCTION audit();"
        "ALTER TABLE watched ENABLE ALWAYS TRIGGER a;"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE uq, watched")
    runner = _backlog(
        pair,
        pair.write_config(),
        [
            "BEGIN; UPDATE uq SET u = 3 WHERE id = 1; UPDATE uq SET u = 1 WHERE id = 2;"
            "UPDATE uq SET u = 2 WHERE id = 1;"
            "UPDATE watched SET v = 1; UPDATE watched SET v = 2; UPDATE watched SET v = 3; COMMIT"
        ],
    )
    wait_equal(pair, ["uq", "watched"], runner=runner)
    assert pair.sub_exec("SELECT v FROM audit ORDER BY v") == [(1,), (2,), (3,)]
    assert runner.stop() == 0
    assert "one by one" not in runner.log()


@ONE_PAIR
def test_merged_update_of_a_missing_row_is_reported_once(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0), (2, 0)")
    pair.sub_exec("DELETE FROM t WHERE id = 2")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = _backlog(
        pair,
        pair.write_config(),
        ["BEGIN; UPDATE t SET v = 1; UPDATE t SET v = 2; UPDATE t SET v = 3; COMMIT"],
    )
    wait_for(lambda: pair.sub_exec("SELECT v FROM t") == [(3,)], 60, "row 1 updated")
    assert runner.stop() == 0
    missing = [ln for ln in runner.log().splitlines() if "found no row" in ln]
    assert len(missing) == 1 and "'id': '2'" in missing[0], missing


@ONE_PAIR
def test_failing_merged_update_is_replayed_to_name_its_change(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0), (2, 0)")
    pair.sub_exec("ALTER TABLE t ADD CONSTRAINT small CHECK (v < 100)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("UPDATE t SET v = 1 WHERE id = 2")
    wait_for(lambda: pair.sub_exec("SELECT v FROM t WHERE id = 2") == [(1,)], 30, "first txn")
    before = origin_lsn(pair, pair.slot)
    with pair.pub_conn() as conn, conn.transaction():
        conn.execute("UPDATE t SET v = 5 WHERE id = 2")
        conn.execute("UPDATE t SET v = 500 WHERE id = 1")
        conn.execute("UPDATE t SET v = 7 WHERE id = 2")
        xid = conn.execute("SELECT txid_current()").fetchone()
    assert runner.wait(60) == 3
    log = runner.log()
    assert "one by one" in log  # the merged statement failed first
    line = [ln for ln in log.splitlines() if " applier: error: " in ln][-1]
    assert "23514" in line and "public.t" in line and "'id': '1'" in line, line
    assert "merged_changes" not in line, line
    assert xid is not None and f"xid={xid[0]}" in line, line
    assert origin_lsn(pair, pair.slot) == before
    assert pair.sub_exec("SELECT id, v FROM t ORDER BY id") == [(1, 0), (2, 1)]


@ONE_PAIR
def test_short_insert_runs_as_multi_row_inserts_name_the_failing_row(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.sub_exec("INSERT INTO t VALUES (17, 'diverged')")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 40) g")
    assert runner.wait(60) == 3
    line = [ln for ln in runner.log().splitlines() if " applier: error: " in ln][-1]
    assert "23505" in line and "'id': '17'" in line and "merged_changes" not in line, line
    assert pair.sub_exec("SELECT count(*) FROM t") == [(1,)]
