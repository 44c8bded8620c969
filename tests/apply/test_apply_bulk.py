"""DELETEs by key held and sent in bulk (``DELETE ... USING (VALUES ...)``), on real servers.

Each test would fail if the thing it names broke: a row the target lacked is
not reported (or reported with another change's key or number), held DELETEs
overtake the UPDATEs or INSERTs of the same keys (an UPDATE then finds no row,
an INSERT a duplicate key), or a failing bulk statement's error names a span
of changes instead of the change that failed. Version-independent: 15->18 only.
"""

from __future__ import annotations

import pytest
from applykit import Runner, wait_equal, wait_for
from conftest import Pair

pytestmark = pytest.mark.parametrize("pair", ["15-18"], indirect=True)


def _backlog(pair: Pair, cfg: object, workload: list[str]) -> Runner:
    """Run ``workload`` while no worker runs, so the worker finds it all in hand (groups)."""
    runner = Runner(pair, cfg).start().ready()  # type: ignore[arg-type]
    assert runner.stop() == 0
    for sql in workload:
        pair.pub_exec(sql)
    return Runner(pair, cfg, "applier2.log").start()  # type: ignore[arg-type]


def test_bulk_deletes_report_each_missing_row_with_its_change(pair: Pair) -> None:
    pair.both(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 3000) g;"
        "CREATE TABLE two (a int, b text, v int, PRIMARY KEY (a, b));"
        "INSERT INTO two SELECT g, 'k' || g, g FROM generate_series(1, 600) g;"
    )
    pair.sub_exec("DELETE FROM t WHERE id IN (7, 1500); DELETE FROM two WHERE a = 300")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = _backlog(
        pair,
        pair.write_config(),
        # One transaction: 2,000 DELETEs of t (8 chunks of 256 and the rest) and
        # 600 of a composite key, interleaved by table.
        ["BEGIN; DELETE FROM t WHERE id <= 2000; DELETE FROM two; DELETE FROM t; COMMIT"],
    )
    wait_equal(pair, ["t", "two"], runner=runner, timeout=90)
    assert runner.stop() == 0
    missing = [ln for ln in runner.log().splitlines() if "found no row" in ln]
    assert len(missing) == 3, missing
    assert "one by one" not in runner.log()
    # Recorded as a single DELETE would: its key, and its own number in the transaction.
    logged = pair.sub_exec(
        "SELECT table_name, key::text, change_no FROM applier.conflict_log "
        "WHERE conflict = 'delete_missing' ORDER BY change_no"
    )
    assert logged == [
        ("t", '{"id": "7"}', 7),
        ("t", '{"id": "1500"}', 1500),
        ("two", '{"a": "300", "b": "k300"}', 2300),
    ], logged


def test_held_deletes_keep_source_order_with_inserts_and_updates(pair: Pair) -> None:
    pair.both(
        "CREATE TABLE t (id int PRIMARY KEY, v int);"
        "INSERT INTO t SELECT g, 0 FROM generate_series(1, 100) g;"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = _backlog(
        pair,
        pair.write_config(),
        [
            # Updates held, then deletes of the same keys: the updates go first.
            "BEGIN; UPDATE t SET v = 1 WHERE id <= 50; DELETE FROM t WHERE id <= 30; "
            # Deletes held, then the keys inserted again: the deletes go first.
            "INSERT INTO t SELECT g, 2 FROM generate_series(1, 30) g; "
            "UPDATE t SET v = 3 WHERE id <= 10; DELETE FROM t WHERE id <= 5; "
            "INSERT INTO t VALUES (1, 4); DELETE FROM t WHERE id = 1; COMMIT",
            # The same keys across transactions of one group.
            "DELETE FROM t WHERE id BETWEEN 60 AND 70",
            "INSERT INTO t SELECT g, 5 FROM generate_series(60, 70) g",
            "UPDATE t SET v = 6 WHERE id BETWEEN 60 AND 65",
            "DELETE FROM t WHERE id BETWEEN 64 AND 80",
        ],
    )
    wait_equal(pair, ["t"], runner=runner, timeout=60)
    assert runner.stop() == 0
    log = runner.log()
    assert "found no row" not in log and "one by one" not in log, log[-3000:]


def test_failing_bulk_delete_is_replayed_to_name_its_change(pair: Pair) -> None:
    # A domain on the target's key refuses the value 13: the statement holding its
    # DELETE fails when its parameters are read (a trigger would keep the table out
    # of bulk statements altogether).
    pair.pub_exec("CREATE TABLE t (id int PRIMARY KEY, v int)")
    pair.sub_exec(
        "CREATE DOMAIN small AS int CHECK (VALUE <> 13);"
        "CREATE TABLE t (id small PRIMARY KEY, v int)"
    )
    pair.pub_exec("INSERT INTO t SELECT g, g FROM generate_series(1, 40) g")
    pair.sub_exec("INSERT INTO t SELECT g, g FROM generate_series(1, 40) g WHERE g <> 13")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = _backlog(pair, pair.write_config(), ["DELETE FROM t"])
    assert runner.wait(60) == 3
    log = runner.log()
    # The bulk statement (rows 1-32 of 40: chunks of 32 and 8) failed first, then one by one.
    first = [ln for ln in log.splitlines() if "one by one" in ln]
    assert first and "merged_changes=32" in first[0], first
    line = [ln for ln in log.splitlines() if " applier: error: " in ln][-1]
    assert "23514" in line and "public.t" in line and "'id': '13'" in line, line
    assert "merged_changes" not in line, line
    wait_for(lambda: pair.sub_exec("SELECT count(*) FROM t") == [(39,)], 10, "nothing applied")
