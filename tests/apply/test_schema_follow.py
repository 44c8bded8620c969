"""[schema] follow: columns added, widened or dropped on the source follow on the target,
nothing installed on the source (issue 33 item 1; applier/apply/handlers/follow.py)."""

from __future__ import annotations

import pytest
from applykit import Runner, origin_lsn, wait_equal, wait_for
from conftest import ONE_PAIR, Pair


def _start(pair: Pair, setup: str, **sections: dict[str, object]) -> Runner:
    pair.both(setup)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    return Runner(pair, pair.write_config(**sections)).start().ready()


def _recorded(pair: Pair) -> list[tuple[str, str, str]]:
    return [
        (str(r[0]), str(r[1]), str(r[2]))
        for r in pair.sub_exec(
            "SELECT source, table_name, statement FROM applier.schema_changes ORDER BY id"
        )
    ]


def _error_line(runner: Runner) -> str:
    return [ln for ln in runner.log().splitlines() if " applier: error: " in ln][-1]


@pytest.mark.parametrize("pair", ["15-15", "15-18", "18-18"], indirect=True)
def test_added_columns_follow_with_their_defaults(pair: Pair) -> None:
    runner = _start(pair, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 5) g")
    wait_equal(pair, ["t"], runner=runner)
    pair.pub_exec(
        "ALTER TABLE t ADD COLUMN d int DEFAULT 5, ADD COLUMN n text, "
        "ADD COLUMN s varchar(10) NOT NULL DEFAULT 'x''y', ADD COLUMN ts timestamptz(3)[]"
    )
    pair.pub_exec("ALTER TABLE t ALTER COLUMN d SET DEFAULT 6")  # existing rows keep 5
    pair.pub_exec("INSERT INTO t (id, v) VALUES (6, 'b')")
    # A column added in the middle of one transaction's changes.
    pair.pub_exec(
        "BEGIN; INSERT INTO t (id, v) VALUES (7, 'c'); UPDATE t SET v = 'u' WHERE id = 1;"
        "ALTER TABLE t ADD COLUMN m numeric(6,2) DEFAULT 1.5;"
        "INSERT INTO t (id, v, m) VALUES (8, 'd', 2.25); UPDATE t SET m = 3 WHERE id = 2; COMMIT"
    )
    wait_equal(pair, ["t"], runner=runner)
    q = (
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull, "
        "pg_get_expr(adbin, adrelid) FROM pg_attribute LEFT JOIN pg_attrdef "
        "ON adrelid = attrelid AND adnum = attnum WHERE attrelid = 't'::regclass "
        "AND attnum > 0 AND NOT attisdropped ORDER BY attname"
    )
    assert pair.sub_exec(q) == pair.pub_exec(q)
    recorded = _recorded(pair)
    assert {r[0] for r in recorded} == {"relation"} and {r[1] for r in recorded} == {"t"}
    assert any('ADD COLUMN "m" numeric(6,2) DEFAULT' in r[2] for r in recorded), recorded
    assert runner.stop() == 0


@ONE_PAIR
def test_added_column_in_a_streamed_transaction(pair: Pair) -> None:
    pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")
    runner = _start(pair, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 100) g")
    wait_equal(pair, ["t"], runner=runner)
    pair.pub_exec(
        "BEGIN; INSERT INTO t SELECT g, repeat('x', 50) FROM generate_series(101, 5000) g;"
        "ALTER TABLE t ADD COLUMN k int DEFAULT 42;"
        "INSERT INTO t SELECT g, 'y', g FROM generate_series(5001, 9000) g;"
        "UPDATE t SET k = -1 WHERE id = 3; COMMIT"
    )
    wait_equal(pair, ["t"], runner=runner, timeout=120)
    assert len(_recorded(pair)) >= 1
    assert runner.stop() == 0


@ONE_PAIR
def test_volatile_default_stops_with_what_to_do(pair: Pair) -> None:
    runner = _start(pair, "CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("INSERT INTO t VALUES (1), (2)")
    wait_equal(pair, ["t"], runner=runner)
    pair.pub_exec("ALTER TABLE t ADD COLUMN at timestamptz DEFAULT clock_timestamp()")
    before = origin_lsn(pair, pair.slot)
    pair.pub_exec("INSERT INTO t VALUES (3)")
    assert runner.wait(60) == 3
    line = _error_line(runner)
    assert "public.t" in line and "'at'" in line and "clock_timestamp()" in line, line
    assert "applier verify --tables public.t" in line, line
    assert origin_lsn(pair, pair.slot) == before
    assert pair.sub_exec("SELECT count(*) FROM t") == [(2,)]
    assert _recorded(pair) == []


@ONE_PAIR
def test_follow_off_stops_with_the_alter(pair: Pair) -> None:
    runner = _start(pair, "CREATE TABLE t (id int PRIMARY KEY)", schema={"follow": False})
    pair.pub_exec("ALTER TABLE t ADD COLUMN d int DEFAULT 5")
    pair.pub_exec("INSERT INTO t VALUES (1)")
    assert runner.wait(60) == 3
    line = _error_line(runner)
    assert 'ALTER TABLE "public"."t" ADD COLUMN "d" integer;' in line, line
    assert _recorded(pair) == []


def test_user_type_missing_on_the_target_stops(pair: Pair) -> None:
    runner = _start(pair, "CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE TYPE mood AS ENUM ('sad', 'ok'); ALTER TABLE t ADD COLUMN m mood")
    pair.pub_exec("INSERT INTO t VALUES (1, 'ok')")
    assert runner.wait(60) == 3
    line = _error_line(runner)
    assert "public.mood" in line and "does not exist on the target" in line, line
    assert "CREATE TYPE" in line, line
    # Created on the target, the column follows at the restart.
    pair.sub_exec("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    runner = Runner(pair, runner.config, "applier2.log").start().ready()
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0


def test_widening_follows_and_narrowing_stops(pair: Pair) -> None:
    runner = _start(pair, "CREATE TABLE t (id int PRIMARY KEY, s varchar(5), n numeric(6,2))")
    pair.pub_exec("INSERT INTO t VALUES (1, 'abc', 1.5)")
    wait_equal(pair, ["t"], runner=runner)
    pair.pub_exec(
        "ALTER TABLE t ALTER COLUMN s TYPE varchar(20), ALTER COLUMN n TYPE numeric(12,2)"
    )
    pair.pub_exec("INSERT INTO t VALUES (2, 'a longer value', 1234567.25)")
    wait_equal(pair, ["t"], runner=runner)
    q = "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 't'::regclass AND attnum > 1 ORDER BY attnum"  # noqa: E501
    assert pair.sub_exec(q) == [("character varying(20)",), ("numeric(12,2)",)]
    pair.pub_exec("ALTER TABLE t ALTER COLUMN n TYPE int")
    pair.pub_exec("INSERT INTO t VALUES (3, 'x', 7)")
    assert runner.wait(60) == 3
    line = _error_line(runner)
    assert "'n'" in line and "numeric(12,2)" in line and "to integer" in line, line
    assert "ALTER COLUMN" in line, line


def test_dropped_column_kept_and_its_not_null_dropped(pair: Pair) -> None:
    runner = _start(pair, "CREATE TABLE t (id int PRIMARY KEY, gone text NOT NULL, keep int)")
    pair.pub_exec("INSERT INTO t VALUES (1, 'kept', 1)")
    wait_equal(pair, ["t"], runner=runner)
    pair.pub_exec("ALTER TABLE t DROP COLUMN gone")
    pair.pub_exec("INSERT INTO t VALUES (2, 2)")
    q = "SELECT id, gone FROM t ORDER BY id"
    wait_for(lambda: pair.sub_exec(q) == [(1, "kept"), (2, None)], 60, runner.log()[-3000:])
    assert any("DROP NOT NULL" in r[2] for r in _recorded(pair))
    assert runner.stop() == 0


@ONE_PAIR
def test_kill_between_the_alter_and_its_commit(pair: Pair) -> None:
    """The ALTER and its record are in the target transaction the origin's stamp commits:
    a worker killed after the ALTER leaves either none of it or all of it, once."""
    runner = _start(pair, "CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE u (id int)")
    pair.pub_exec("INSERT INTO t VALUES (1)")
    wait_equal(pair, ["t"], runner=runner)
    blocker = pair.sub_conn()
    blocker.execute("BEGIN; LOCK TABLE u IN ACCESS EXCLUSIVE MODE")
    pair.pub_exec(
        "BEGIN; ALTER TABLE t ADD COLUMN d int DEFAULT 9; INSERT INTO t VALUES (2, 3);"
        "INSERT INTO u VALUES (1); COMMIT"
    )
    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'applier apply' "
        "AND wait_event_type = 'Lock'"
    )
    wait_for(lambda: pair.sub_exec(waiting) == [(1,)], 60, "the worker to wait after the ALTER")
    runner.kill()
    blocker.execute("ROLLBACK")
    blocker.close()
    runner = Runner(pair, runner.config, "applier2.log").start().ready()
    wait_equal(pair, ["t", "u"], runner=runner)
    assert [r[2] for r in _recorded(pair)] == [
        'ALTER TABLE "public"."t" ADD COLUMN "d" integer DEFAULT \'9\'::integer'
    ]
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_added_column_first_seen_in_a_live_streamed_transaction(pair: Pair) -> None:
    """The first Relation message of a session arrives in a streamed transaction applied
    live: the schema change waits for its commit (restreamed, replayed from its spool)."""
    pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")
    runner = _start(pair, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 100) g")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    pair.pub_exec("ALTER TABLE t ADD COLUMN k int DEFAULT 42")
    runner = Runner(pair, runner.config, "applier2.log").start().ready()
    pair.pub_exec("INSERT INTO t SELECT g, repeat('x', 50), g FROM generate_series(101, 9000) g")
    wait_equal(pair, ["t"], runner=runner, timeout=120)
    assert len(_recorded(pair)) == 1
    assert "a schema change is applied at the transaction's commit" in runner.log()
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_added_column_in_a_careful_replay(pair: Pair) -> None:
    """A transaction replayed with a savepoint per change (a conflict policy takes its
    failure) runs its schema change once, outside the changes' savepoints."""
    pair.pub_exec("CREATE TABLE t (id int PRIMARY KEY, u int)")
    pair.sub_exec("CREATE TABLE t (id int PRIMARY KEY, u int UNIQUE)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    cfg.write_text(cfg.read_text() + '\n[conflicts]\ndefault = { update_exists = "skip" }\n')
    assert Runner(pair, cfg, "slot.log").start().ready().stop() == 0
    pair.sub_exec("INSERT INTO t VALUES (100, 5)")
    pair.pub_exec(
        "INSERT INTO t VALUES (1, 1);"
        "BEGIN; INSERT INTO t VALUES (6, 6); ALTER TABLE t ADD COLUMN c int DEFAULT 4;"
        "UPDATE t SET u = 5 WHERE id = 1; INSERT INTO t VALUES (7, 7, 7); COMMIT;"
        "INSERT INTO t VALUES (8, 8, 8);"
    )
    runner = Runner(pair, cfg).start().ready()
    q = "SELECT to_jsonb(t) FROM t ORDER BY id"
    want = [
        {"id": 1, "u": 1, "c": 4}, {"id": 6, "u": 6, "c": 4}, {"id": 7, "u": 7, "c": 7},
        {"id": 8, "u": 8, "c": 8}, {"id": 100, "u": 5, "c": 4},
    ]  # fmt: skip
    wait_for(lambda: [r[0] for r in pair.sub_exec(q)] == want, 30, "the rows")
    assert "replaying with a savepoint per change" in runner.log()
    assert len(_recorded(pair)) == 1
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_a_statement_the_target_refuses_stops_and_leaves_nothing(pair: Pair) -> None:
    """The seam's failure: exit 3 naming the statement, LSN, xid and table; the column
    added before it in the same target transaction is rolled back with it."""
    runner = _start(pair, "CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("INSERT INTO t VALUES (1)")
    wait_equal(pair, ["t"], runner=runner)
    before = origin_lsn(pair, pair.slot)
    pair.pub_exec(
        "CREATE FUNCTION seven() RETURNS int IMMUTABLE LANGUAGE sql AS 'SELECT 7';"
        "ALTER TABLE t ADD COLUMN d int DEFAULT 5; ALTER TABLE t ALTER COLUMN d SET DEFAULT seven()"
    )
    pair.pub_exec("INSERT INTO t VALUES (2)")
    assert runner.wait(60) == 3
    line = _error_line(runner)
    assert "refused a schema change" in line and "public.seven()" in line, line
    assert "lsn=" in line and "xid=" in line and "table=public.t" in line, line
    assert origin_lsn(pair, pair.slot) == before
    assert pair.sub_exec("SELECT count(*) FROM pg_attribute WHERE attname = 'd'") == [(0,)]
    assert _recorded(pair) == []
    # Created on the target, the restarted worker runs both statements, once.
    pair.sub_exec("CREATE FUNCTION seven() RETURNS int IMMUTABLE LANGUAGE sql AS 'SELECT 7'")
    runner = Runner(pair, runner.config, "applier2.log").start().ready()
    wait_equal(pair, ["t"], runner=runner)
    assert len(_recorded(pair)) == 2
    assert runner.stop() == 0
