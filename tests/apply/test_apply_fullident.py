"""REPLICA IDENTITY FULL on a target table without an index: a group's changes, one scan.

On real servers (15->18 only: nothing here differs by version). Each test would
fail if the thing it names broke: duplicates of an old row changed twice or
not at all, a NULL in an old row not matched, a chain (A -> B -> C in one
group) left half done, a json column refused by ``=``, a row the target
lacks not reported with its change, or one table scan per change.
"""

from __future__ import annotations

import pytest
from applykit import Runner, wait_equal, wait_for
from conftest import Pair

pytestmark = pytest.mark.parametrize("pair", ["15-18"], indirect=True)

DDL = """
CREATE TABLE f (a int, b text, c int);
ALTER TABLE f REPLICA IDENTITY FULL;
INSERT INTO f VALUES (1, 'x', 1), (1, 'x', 1), (1, 'x', 1), (2, NULL, 2), (3, 'z', 3),
                     (4, 'w', 4), (4, 'w', 4), (5, NULL, NULL), (6, 'gone', 6);
INSERT INTO f SELECT g, 'r' || g, g FROM generate_series(10, 2000) g;
CREATE TABLE done (n int);
"""

#: Single-row changes, each its own transaction (one group on the target).
WORKLOAD = [
    # Duplicates: exactly one of the three (1, x, 1) rows, then another one.
    "UPDATE f SET c = 10 WHERE ctid = (SELECT ctid FROM f WHERE a = 1 AND c = 1 LIMIT 1)",
    "UPDATE f SET c = 11 WHERE ctid = (SELECT ctid FROM f WHERE a = 1 AND c = 1 LIMIT 1)",
    # NULLs in the old row (one column, and all but one).
    "UPDATE f SET c = 20 WHERE a = 2",
    "UPDATE f SET b = 'five' WHERE a = 5",
    # A chain: 3 -> 30 -> 31 -> 32 in three transactions of one group.
    "UPDATE f SET c = 30 WHERE a = 3",
    "UPDATE f SET c = 31 WHERE a = 3",
    "UPDATE f SET c = 32 WHERE a = 3",
    # DELETE of one of two identical rows, then of a row updated before.
    "DELETE FROM f WHERE ctid = (SELECT ctid FROM f WHERE a = 4 LIMIT 1)",
    "DELETE FROM f WHERE a = 2",
    # A row the target lacks.
    "UPDATE f SET c = 60 WHERE a = 6",
    *[f"UPDATE f SET c = c + 1 WHERE a = {g}" for g in range(100, 160)],
    "INSERT INTO done VALUES (1)",
]


def _backlog(pair: Pair, cfg: object, workload: list[str]) -> Runner:
    """Run ``workload`` while no worker runs, so the worker finds it all in hand (groups)."""
    runner = Runner(pair, cfg).start().ready()  # type: ignore[arg-type]
    assert runner.stop() == 0
    for sql in workload:
        pair.pub_exec(sql)
    return Runner(pair, cfg, "applier2.log").start()  # type: ignore[arg-type]


def _stat(pair: Pair, table: str, column: str) -> int:
    """A cumulative statistic of ``table`` on the target (seq_scan, n_tup_upd)."""
    rows = pair.sub_exec(f"SELECT {column} FROM pg_stat_user_tables WHERE relname = '{table}'")
    return int(rows[0][0])


def test_full_identity_group_in_few_scans(pair: Pair) -> None:
    pair.both(DDL)
    pair.sub_exec("DELETE FROM f WHERE a = 6")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = _backlog(pair, pair.write_config(), WORKLOAD)
    wait_for(lambda: pair.sub_exec("SELECT count(*) FROM done") == [(1,)], 60, "workload")
    assert runner.stop() == 0  # the backend exits: its statistics are flushed
    wait_for(lambda: _stat(pair, "f", "n_tup_upd") >= 67, 10, "statistics")
    # 70 changes in one group; one scan each would be 70 (chains and kind
    # switches add a statement each: a handful).
    scans = _stat(pair, "f", "seq_scan")
    assert scans <= 12, scans
    # pub.f minus the row the target lacked.
    pair.pub_exec("DELETE FROM f WHERE a = 6")
    wait_equal(pair, ["f"], order="a, b, c")
    assert pair.sub_exec("SELECT c FROM f WHERE a = 1 ORDER BY c") == [(1,), (10,), (11,)]
    log = runner.log()
    missing = [ln for ln in log.splitlines() if "found no row" in ln]
    assert len(missing) == 1 and "'a': '6'" in missing[0] and "'c': '6'" in missing[0], missing
    assert "one by one" not in log


def test_full_identity_with_json_goes_row_by_row(pair: Pair) -> None:
    # json has no ``=``: the table keeps a statement per change, comparing ::text.
    pair.both(
        "CREATE TABLE j (a int, doc json, p point); ALTER TABLE j REPLICA IDENTITY FULL;"
        "INSERT INTO j SELECT g, json_build_object('g', g), point(g, g) "
        "FROM generate_series(1, 50) g; INSERT INTO j VALUES (7, '{\"g\": 7}', point(7, 7))"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = _backlog(
        pair,
        pair.write_config(),
        [
            "UPDATE j SET a = a + 100 WHERE a <= 5",
            "DELETE FROM j WHERE ctid = (SELECT ctid FROM j WHERE a = 7 LIMIT 1)",
            *[f"UPDATE j SET doc = '[{g}]' WHERE a = {g}" for g in range(10, 30)],
        ],
    )
    wait_equal(pair, ["j"], runner=runner, order="a, doc::text")
    assert runner.stop() == 0
    assert pair.sub_exec("SELECT count(*) FROM j WHERE a = 7") == [(1,)]


def test_full_identity_with_an_index_uses_it(pair: Pair) -> None:
    # With an index the per-change statement compares with = / IS NULL, which the
    # index serves (IS NOT DISTINCT FROM never would): no scan per change.
    pair.both(DDL)
    pair.sub_exec("CREATE INDEX ON f (a); DELETE FROM f WHERE a = 6; ANALYZE f")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = _backlog(pair, pair.write_config(), WORKLOAD)
    wait_for(lambda: pair.sub_exec("SELECT count(*) FROM done") == [(1,)], 60, "workload")
    assert runner.stop() == 0
    wait_for(lambda: _stat(pair, "f", "n_tup_upd") >= 67, 10, "statistics")
    assert _stat(pair, "f", "seq_scan") <= 2, _stat(pair, "f", "seq_scan")
    pair.pub_exec("DELETE FROM f WHERE a = 6")
    wait_equal(pair, ["f"], order="a, b, c")
