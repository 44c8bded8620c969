"""Apply errors and schema mismatches stop the worker with context; progress does not move."""

from __future__ import annotations

import json
import re
import time

import pytest
from applykit import Runner, origin_lsn, wait_equal, wait_for
from conftest import ONE_PAIR, Pair


@ONE_PAIR
def test_unique_violation_stops_with_context(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.sub_exec("INSERT INTO t VALUES (2, 'diverged')")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1, 'a')")
    # Wait until the first transaction is applied.
    deadline = time.monotonic() + 30
    while pair.sub_exec("SELECT count(*) FROM t")[0][0] < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    before = origin_lsn(pair, pair.slot)
    pair.pub_exec("INSERT INTO t VALUES (3, 'c'), (2, 'b')")
    pair.pub_exec("INSERT INTO t VALUES (4, 'd')")
    rc = runner.wait(60)
    assert rc == 3
    log = runner.log()
    line = [ln for ln in log.splitlines() if " applier: error: " in ln][-1]
    assert "23505" in line and "public.t" in line and "'id': '2'" in line
    assert "lsn=" in line and "xid=" in line
    assert origin_lsn(pair, pair.slot) == before
    # Nothing of the failed transaction nor after it.
    assert pair.sub_exec("SELECT id FROM t ORDER BY id") == [(1,), (2,)]
    row = pair.sub_exec("SELECT state, last_error FROM applier.worker_status")[0]
    assert row[0] == "error"
    err = row[1] if isinstance(row[1], dict) else json.loads(row[1])
    assert err["context"]["sqlstate"] == "23505"
    assert err["context"]["table"] == "public.t"


def test_schema_mismatch_missing_column_and_table(pair: Pair) -> None:
    pair.pub_exec(
        "CREATE TYPE mood AS ENUM ('sad', 'ok');"
        'CREATE TABLE t (id int PRIMARY KEY, v text, extra numeric(10,2), "Mixed Case" '
        "varchar(20), m mood, ts timestamptz(3)[])"
    )
    pair.sub_exec(
        "CREATE TYPE mood AS ENUM ('sad', 'ok'); CREATE TABLE t (id int PRIMARY KEY, v text)"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    # [schema] follow would add them (tests/apply/test_schema_follow.py).
    cfg = pair.write_config(schema={"follow": False})
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1, 'a', 1.5, 'x', 'ok', ARRAY[now()])")
    assert runner.wait(60) == 3
    line = [ln for ln in runner.log().splitlines() if " applier: error: " in ln][-1]
    assert "public.t" in line and "'extra'" in line and "missing" in line
    assert origin_lsn(pair, pair.slot) in (None, "0/0")
    assert pair.sub_exec("SELECT count(*) FROM t") == [(0,)]
    # The hint is the exact statement, with the source's types and quoted names.
    alter = re.search(r"ALTER TABLE [^;]+;", line)
    assert alter, line
    assert alter.group(0) == (
        'ALTER TABLE "public"."t" ADD COLUMN "extra" numeric(10,2), '
        'ADD COLUMN "Mixed Case" character varying(20), ADD COLUMN "m" "public"."mood", '
        'ADD COLUMN "ts" timestamp(3) with time zone[];'
    ), line
    # Fix the target with it; the restarted worker applies the held-back transaction.
    pair.sub_exec(alter.group(0))
    runner = Runner(pair, cfg, "applier2.log").start().ready()
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0


def test_missing_table_and_type_mismatch(pair: Pair) -> None:
    pair.pub_exec("CREATE TABLE only_src (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("INSERT INTO only_src VALUES (1)")
    # Issue 15: a table applier never copied is skipped with a warning (sync-tables
    # copies it); one it knows stops the worker (tests/synctables/test_unknown_tables.py).
    wait_for(lambda: "public.only_src is published but does not exist" in runner.log(), 30)
    assert runner.alive()
    assert runner.stop() == 0

    pair.pub_exec("CREATE TABLE ty (id int PRIMARY KEY, d date)")
    pair.sub_exec("CREATE TABLE ty (id int PRIMARY KEY, d int)")
    cfg = pair.write_config(tables={"include": ["public.ty"]})
    pair.pub_exec("INSERT INTO ty VALUES (1, now())")
    runner = Runner(pair, cfg, "applier2.log").start()
    assert runner.wait(60) == 3
    line = [ln for ln in runner.log().splitlines() if " applier: error: " in ln][-1]
    assert "public.ty" in line and "'d'" in line and "date" in line


def test_column_added_mid_stream(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.sub_exec("ALTER TABLE t ADD COLUMN target_only int DEFAULT 7")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1, 'a')")
    pair.sub_exec("ALTER TABLE t ADD COLUMN n numeric")
    pair.pub_exec("ALTER TABLE t ADD COLUMN n numeric")
    pair.pub_exec("INSERT INTO t VALUES (2, 'b', 2.5); UPDATE t SET n = 1 WHERE id = 1")
    pair.pub_exec("ALTER TABLE t DROP COLUMN v")
    pair.pub_exec("INSERT INTO t VALUES (3, 3.5)")
    deadline = time.monotonic() + 30
    q = "SELECT id, n FROM t ORDER BY id"
    while pair.sub_exec(q) != pair.pub_exec(q):
        assert time.monotonic() < deadline, runner.log()[-3000:]
        assert runner.alive(), runner.log()[-3000:]
        time.sleep(0.2)
    assert pair.sub_exec("SELECT DISTINCT target_only FROM t") == [(7,)]
    assert runner.stop() == 0


# A deferred constraint trigger: fires at SET CONSTRAINTS ALL IMMEDIATE, before COMMIT.
_FAIL_DEFERRED = (
    "CREATE FUNCTION no7() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF NEW.u = 7 THEN RAISE unique_violation USING MESSAGE = 'u = 7 is taken'; END IF; "
    "RETURN NULL; END $$;"
    "CREATE CONSTRAINT TRIGGER no7 AFTER INSERT ON t DEFERRABLE INITIALLY DEFERRED "
    "FOR EACH ROW EXECUTE FUNCTION no7();"
    "ALTER TABLE t ENABLE ALWAYS TRIGGER no7;"
)
# The same trigger defers a second one again: the failure happens inside COMMIT itself,
# after which the session is out of any transaction block (what the guard is for).
_FAIL_IN_COMMIT = (
    "CREATE TABLE t_late (id int);"
    "CREATE FUNCTION fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "RAISE unique_violation USING MESSAGE = 'u = 7 is taken (at commit)'; END $$;"
    "CREATE CONSTRAINT TRIGGER fail AFTER INSERT ON t_late DEFERRABLE INITIALLY DEFERRED "
    "FOR EACH ROW EXECUTE FUNCTION fail();"
    "ALTER TABLE t_late ENABLE ALWAYS TRIGGER fail;"
    "CREATE FUNCTION no7() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF NEW.u = 7 THEN SET CONSTRAINTS ALL DEFERRED; INSERT INTO public.t_late VALUES (1); END IF; "
    "RETURN NULL; END $$;"
    "CREATE CONSTRAINT TRIGGER no7 AFTER INSERT ON t DEFERRABLE INITIALLY DEFERRED "
    "FOR EACH ROW EXECUTE FUNCTION no7();"
    "ALTER TABLE t ENABLE ALWAYS TRIGGER no7;"
)


@pytest.mark.parametrize("in_commit", [False, True], ids=["deferred", "in_commit"])
@pytest.mark.parametrize("group_commit", [1, 100])
@ONE_PAIR
def test_commit_time_failure_stops_everything_after_it(
    pair: Pair, group_commit: int, in_commit: bool
) -> None:
    """A transaction that fails at its end (a deferred trigger, or inside COMMIT itself)
    while later transactions are already pipelined behind it: none of them may commit
    (an aborted transaction block, or else the session's guard), and the error names
    the failing transaction."""
    pair.pub_exec("CREATE TABLE t (id int PRIMARY KEY, u int)")
    # Deferred unique checks do not fire under session_replication_role = replica;
    # ENABLE ALWAYS constraint triggers do.
    pair.sub_exec(
        "CREATE TABLE t (id int PRIMARY KEY, u int);"
        + (_FAIL_IN_COMMIT if in_commit else _FAIL_DEFERRED)
        + "INSERT INTO t VALUES (1000, 0)"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"group_commit": group_commit})
    runner = Runner(pair, cfg).start().ready()
    assert runner.stop() == 0  # the slot exists: what follows is a backlog
    pair.pub_exec("INSERT INTO t VALUES (1, 1)")
    bad_xid = pair.pub_exec("INSERT INTO t VALUES (2, 7) RETURNING txid_current()")[0][0]
    # Many small transactions in one batch: sent before the failure's result is back.
    pair.pub_exec(
        "".join(f"BEGIN; INSERT INTO t VALUES ({i}, {i * 10 + 1}); COMMIT;" for i in range(3, 400))
    )
    runner = Runner(pair, cfg, "applier2.log").start()
    assert runner.wait(90) == 3
    line = [ln for ln in runner.log().splitlines() if " applier: error: " in ln][-1]
    assert "23505" in line and f"xid={bad_xid}" in line, line
    assert pair.sub_exec("SELECT id FROM t ORDER BY id") == [(1,), (1000,)]
