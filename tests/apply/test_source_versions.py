"""Source versions: failover slots on PostgreSQL 17+ (refused before), and a PostgreSQL 16
source applied into 18."""

from __future__ import annotations

import pytest
from applykit import Runner, wait_equal, wait_for
from conftest import Pair


def slot_failover(pair: Pair) -> list[tuple[object, ...]]:
    return pair.pub_exec(
        f"SELECT failover FROM pg_replication_slots WHERE slot_name = '{pair.slot}'"
    )


def setup_table(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")


@pytest.mark.parametrize("any_pair", ["18-18", "17-18"], indirect=True)
def test_run_creates_a_failover_slot_on_17_and_18(any_pair: Pair) -> None:
    pair = any_pair
    setup_table(pair)
    runner = Runner(pair, pair.write_config(source={"failover": True})).start().ready()
    assert slot_failover(pair) == [(True,)]
    pair.pub_exec("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 50) g")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0


@pytest.mark.parametrize("any_pair", ["18-18"], indirect=True)
def test_an_existing_slot_is_made_a_failover_slot(any_pair: Pair) -> None:
    pair = any_pair
    setup_table(pair)
    runner = Runner(pair, pair.write_config()).start().ready()
    assert runner.stop() == 0
    assert slot_failover(pair) == [(False,)]
    cfg = pair.write_config(source={"failover": True})
    runner = Runner(pair, cfg, "applier2.log").start().ready()
    assert slot_failover(pair) == [(True,)]
    pair.pub_exec("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 50) g")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    # failover = false (the default) leaves a failover slot as it is.
    runner = Runner(pair, pair.write_config(), "applier3.log").start().ready()
    assert runner.stop() == 0
    assert slot_failover(pair) == [(True,)]


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_failover_before_17_is_refused_before_any_slot(pair: Pair) -> None:
    setup_table(pair)
    runner = Runner(pair, pair.write_config(source={"failover": True})).start()
    assert runner.wait(60) == 2
    assert "source.failover = true needs PostgreSQL 17" in runner.log()
    rows = pair.pub_exec(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{pair.slot}'")
    assert rows == []


@pytest.mark.parametrize("any_pair", ["16-18"], indirect=True)
def test_a_16_source_with_origin_none_and_two_phase(any_pair: Pair) -> None:
    """PostgreSQL 16: protocol 4, the source filters by origin itself, two-phase decoded."""
    pair = any_pair
    setup_table(pair)
    cfg = pair.write_config(source={"origin": "none"}, apply={"two_phase": True})
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 200) g")
    pair.pub_exec("UPDATE t SET v = 'u' WHERE id % 3 = 0")
    pair.pub_exec("DELETE FROM t WHERE id % 5 = 0")
    with pair.pub_conn() as conn:
        conn.autocommit = True
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (1000, 'prepared')")
        conn.execute("PREPARE TRANSACTION 'p16'")
        conn.execute("COMMIT PREPARED 'p16'")
    # A transaction with a replication origin is not sent by the source (origin = none).
    with pair.pub_conn() as conn:
        conn.autocommit = True
        conn.execute("SELECT pg_replication_origin_create('elsewhere')")
        conn.execute("SELECT pg_replication_origin_session_setup('elsewhere')")
        conn.execute("INSERT INTO t VALUES (2000, 'from elsewhere')")
        conn.execute("SELECT pg_replication_origin_session_reset()")
        conn.execute("SELECT pg_replication_origin_drop('elsewhere')")
    pair.pub_exec("INSERT INTO t VALUES (3000, 'last')")
    wait_for(
        lambda: pair.sub_exec("SELECT count(*) FROM t WHERE id = 3000") == [(1,)],
        30,
        "the last row",
    )
    src = pair.pub_exec("SELECT id, v FROM t WHERE id <> 2000 ORDER BY id")
    assert pair.sub_exec("SELECT id, v FROM t ORDER BY id") == src
    assert runner.stop() == 0
    assert "proto_version=4" in runner.log(), runner.log()[-3000:]
