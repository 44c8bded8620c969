"""The worker and a published table the target lacks: skipped with a warning when applier
never copied it, a stop when it did (a table dropped by mistake is not skipped)."""

from __future__ import annotations

import pytest
from apply.applykit import Runner, wait_equal, wait_for
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
    wait_for(lambda: not runner.alive(), 30, "the worker to stop")
    assert runner.wait() == 3
    assert "table public.b does not exist on the target" in runner.log()
