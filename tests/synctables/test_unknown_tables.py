"""The worker and a published table the target lacks: skipped with a warning when applier
never copied it, a stop when it did (a table dropped by mistake is not skipped)."""

from __future__ import annotations

import pytest
from apply.applykit import Runner, wait_equal
from conftest import Pair
from synckit import state


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_unknown_table_is_skipped_with_one_warning(pair: Pair) -> None:
    pair.both("CREATE TABLE a (id int PRIMARY KEY, n int)")
    pair.pub_exec("CREATE TABLE t_new (id int PRIMARY KEY, n int)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE a")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("ALTER PUBLICATION pub ADD TABLE t_new")
    for i in range(1, 6):
        pair.pub_exec(f"INSERT INTO a VALUES ({i}, 0); INSERT INTO t_new VALUES ({i}, 0)")
        pair.pub_exec(f"UPDATE t_new SET n = 1 WHERE id = {i}; TRUNCATE t_new")
    pair.pub_exec("INSERT INTO t_new VALUES (9, 9); TRUNCATE a, t_new; INSERT INTO a VALUES (7, 7)")
    wait_equal(pair, ["a"], runner=runner)
    assert pair.sub_exec("SELECT id FROM a") == [(7,)]  # one TRUNCATE of both: a's half applied
    assert runner.alive()
    log = runner.log()
    assert log.count("run `applier sync-tables") == 1, log[-3000:]
    st = state(pair)
    assert st is not None and st[0] == "skipped"
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_known_table_dropped_on_target_stops_the_worker(pair: Pair) -> None:
    pair.both("CREATE TABLE a (id int PRIMARY KEY, n int); CREATE TABLE b (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE a, b")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("INSERT INTO a VALUES (1, 0)")
    wait_equal(pair, ["a"], runner=runner)
    # First start with table_sync: the target's tables were recorded as ready.
    assert pair.sub_exec("SELECT table_name, state FROM applier.table_sync ORDER BY 1") == [
        ("a", "ready"),
        ("b", "ready"),
    ]
    pair.sub_exec("DROP TABLE b")
    pair.pub_exec("INSERT INTO b VALUES (1)")
    assert runner.wait(30) == 3
    assert "table public.b does not exist on the target" in runner.log()


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_table_renamed_on_the_source_stops_until_the_target_follows(pair: Pair) -> None:
    """A renamed table is not a new one: its changes are not skipped. The worker
    stops, at every restart, until the target's table has the new name too."""
    pair.both("CREATE TABLE a (id int PRIMARY KEY, n int)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE a")
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO a VALUES (1, 0)")
    wait_equal(pair, ["a"], runner=runner)
    pair.pub_exec("ALTER TABLE a RENAME TO b")
    pair.pub_exec("INSERT INTO b VALUES (2, 0); UPDATE b SET n = 1 WHERE id = 1")
    assert runner.wait(30) == 3
    log = runner.log()
    assert "table public.a was renamed on the source to public.b" in log, log[-3000:]
    assert 'ALTER TABLE "public"."a" RENAME TO "b"' in log
    assert pair.sub_exec("SELECT id, n FROM a") == [(1, 0)]
    assert pair.sub_exec("SELECT count(*) FROM applier.table_sync WHERE state = 'skipped'") == [
        (0,)
    ]
    # A new process knows it from the target, not from the session that saw the rename.
    again = Runner(pair, cfg).start()
    assert again.wait(30) == 3
    assert "was renamed on the source" in again.log()
    pair.sub_exec("ALTER TABLE a RENAME TO b")
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO b VALUES (3, 3)")
    wait_equal(pair, ["b"], runner=runner)
    assert pair.sub_exec("SELECT id, n FROM b ORDER BY id") == [(1, 1), (2, 0), (3, 3)]
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_table_moved_to_another_schema_on_the_source_stops_the_worker(pair: Pair) -> None:
    pair.both("CREATE SCHEMA s2; CREATE TABLE a (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE a")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("INSERT INTO a VALUES (1)")
    wait_equal(pair, ["a"], runner=runner)
    pair.pub_exec("ALTER TABLE a SET SCHEMA s2; INSERT INTO s2.a VALUES (2)")
    assert runner.wait(30) == 3
    log = runner.log()
    assert "table public.a was renamed on the source to s2.a" in log, log[-3000:]
    assert 'ALTER TABLE "public"."a" SET SCHEMA "s2"' in log
    assert pair.sub_exec("SELECT id FROM a") == [(1,)]


@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_table_renamed_out_of_the_included_tables_stops_the_worker(pair: Pair) -> None:
    """Renamed to a name `[tables]` leaves out, an applied table's changes would be
    dropped as an excluded table's: the worker stops and says so."""
    pair.both("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE c (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE a, c")
    runner = Runner(pair, pair.write_config(tables={"include": ["public.a", "public.c"]}))
    runner.start().ready()
    pair.pub_exec("INSERT INTO a VALUES (1)")
    wait_equal(pair, ["a"], runner=runner)
    pair.pub_exec("ALTER TABLE a RENAME TO b; INSERT INTO b VALUES (2); INSERT INTO c VALUES (1)")
    assert runner.wait(30) == 3
    log = runner.log()
    assert "table public.a was renamed on the source to public.b, which [tables] does not" in log
    assert pair.sub_exec("SELECT id FROM a") == [(1,)]
    assert pair.sub_exec("SELECT count(*) FROM c") == [(0,)]  # same transaction: not committed
