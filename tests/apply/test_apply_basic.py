"""End-to-end basics: insert/update/delete for each replica identity, TOAST, truncate, skips."""

from __future__ import annotations

import signal

import pytest
from applykit import Runner, origin_lsn, wait_equal, wait_for
from conftest import CORE_PAIRS, ONE_PAIR, SMOKE_PAIRS, Pair


@pytest.mark.parametrize("pair", SMOKE_PAIRS, indirect=True)
def test_insert_update_delete_default_identity(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("INSERT INTO t SELECT g, 'v' || g, g / 3.0 FROM generate_series(1, 500) g")
    pair.pub_exec("UPDATE t SET v = 'changed' WHERE id % 7 = 0")
    pair.pub_exec("UPDATE t SET id = id + 1000 WHERE id % 11 = 0")
    pair.pub_exec("DELETE FROM t WHERE id % 5 = 0")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    assert origin_lsn(pair, pair.slot) not in (None, "0/0")
    log = runner.log()
    assert "applier run stopped" in log


@ONE_PAIR
def test_sigterm_exits_zero_and_resume(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 100) g")
    wait_equal(pair, ["t"], runner=runner)
    runner.signal(signal.SIGTERM)
    assert runner.wait(60) == 0
    pair.pub_exec("INSERT INTO t SELECT g, 'b' FROM generate_series(101, 200) g")
    runner = Runner(pair, cfg).start().ready()
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    status = pair.sub_exec("SELECT state, applied_txns FROM applier.worker_status")
    assert status[0][0] == "stopped"


@pytest.mark.parametrize("ident", ["full", "index"])
@ONE_PAIR
def test_replica_identity_full_and_index(pair: Pair, ident: str) -> None:
    ddl = "CREATE TABLE t (a int NOT NULL, b text, j json, p point, d int)"
    pair.both(ddl)
    if ident == "full":
        pair.both("ALTER TABLE t REPLICA IDENTITY FULL")
    else:
        pair.both(
            "CREATE UNIQUE INDEX t_ab ON t (a); ALTER TABLE t REPLICA IDENTITY USING INDEX t_ab"
        )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec(
        "INSERT INTO t SELECT g, CASE WHEN g % 3 = 0 THEN NULL ELSE 'b' || g END, "
        "json_build_object('g', g), point(g, g), g FROM generate_series(1, 50) g"
    )
    pair.pub_exec("UPDATE t SET d = d * 10 WHERE a % 2 = 0")
    pair.pub_exec("UPDATE t SET b = 'x' WHERE b IS NULL")
    pair.pub_exec("DELETE FROM t WHERE a % 5 = 0")
    wait_equal(pair, ["t"], runner=runner, order="a")
    assert runner.stop() == 0


@ONE_PAIR
def test_full_identity_duplicates_change_one_row(pair: Pair) -> None:
    pair.both("CREATE TABLE t (a int, b text)")
    pair.both("ALTER TABLE t REPLICA IDENTITY FULL")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1, 'x'), (1, 'x'), (1, 'x'), (2, NULL), (2, NULL)")
    pair.pub_exec("UPDATE t SET b = 'y' WHERE ctid = (SELECT ctid FROM t WHERE a = 1 LIMIT 1)")
    pair.pub_exec("DELETE FROM t WHERE ctid = (SELECT ctid FROM t WHERE a = 2 LIMIT 1)")
    wait_equal(pair, ["t"], runner=runner, order="a, b")
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", CORE_PAIRS, indirect=True)
def test_toast_unchanged_and_large_values(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, big text, small int, bin bytea)")
    pair.pub_exec("ALTER TABLE t ALTER big SET STORAGE EXTERNAL")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec(
        "INSERT INTO t SELECT g, repeat(md5(g::text), 20000), g, "
        "decode(repeat(md5(g::text), 3000), 'hex') FROM generate_series(1, 10) g"
    )
    pair.pub_exec("UPDATE t SET small = small + 1")  # big and bin unchanged: sent as 'u'
    pair.pub_exec("UPDATE t SET big = 'short' WHERE id = 3")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", CORE_PAIRS, indirect=True)
def test_truncate_options_and_skipped_tables(pair: Pair) -> None:
    pair.both(
        "CREATE TABLE a (id serial PRIMARY KEY, v int);"
        "CREATE TABLE b (id int PRIMARY KEY, a_id int REFERENCES a(id));"
        "CREATE TABLE c (id int PRIMARY KEY);"
        "CREATE TABLE skipped (id int PRIMARY KEY)"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(tables={"include": ["public.*"], "exclude": ["public.skipped"]})
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO a (v) SELECT g FROM generate_series(1, 5) g")
    pair.pub_exec("INSERT INTO b SELECT g, g FROM generate_series(1, 5) g")
    pair.pub_exec("INSERT INTO c SELECT g FROM generate_series(1, 5) g")
    pair.pub_exec("INSERT INTO skipped SELECT g FROM generate_series(1, 5) g")
    wait_equal(pair, ["a", "b", "c"], runner=runner)
    assert pair.sub_exec("SELECT count(*) FROM skipped")[0][0] == 0
    pair.pub_exec("TRUNCATE a, b RESTART IDENTITY")
    pair.pub_exec("INSERT INTO a (v) VALUES (100)")
    pair.pub_exec("TRUNCATE c")
    wait_equal(pair, ["a", "b", "c"], runner=runner)
    # RESTART IDENTITY on the target: the next serial value there starts over too.
    assert pair.sub_exec("SELECT id FROM a") == [(1,)]
    wait_for(
        lambda: pair.sub_exec("SELECT skipped_changes FROM applier.worker_status")[0][0] >= 5,
        what="skipped_changes counted",
    )
    assert runner.stop() == 0
