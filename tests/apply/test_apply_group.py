"""Group commit: many source transactions per target transaction, exactly once, errors isolated."""

from __future__ import annotations

import pytest
from applykit import Runner, origin_lsn, wait_equal
from conftest import ONE_PAIR, Pair

#: The C speedups (read loop, fill, dispatch loop) or their Python twins in the worker.
SPEEDUPS = pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])


def _backlog(pair: Pair, group_commit: int | None = None, pure: bool = False) -> Runner:
    """Start once (creates the slot), stop, so what follows is a backlog read in batches."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    apply = {} if group_commit is None else {"group_commit": group_commit}
    runner = Runner(
        pair,
        pair.write_config(apply=apply) if apply else pair.write_config(),
        env={"APPLIER_PURE_PYTHON": "1"} if pure else None,
    )
    runner.start().ready()
    assert runner.stop() == 0
    return runner


@SPEEDUPS
@ONE_PAIR
def test_group_commit_default_groups_backlog_exactly_once(pair: Pair, pure: bool) -> None:
    runner = _backlog(pair, pure=pure)
    for i in range(1, 301):
        pair.pub_exec(f"INSERT INTO t VALUES ({i}, 'v{i}')")
    pair.pub_exec("UPDATE t SET v = v || '!' WHERE id % 7 = 0")
    pair.pub_exec("DELETE FROM t WHERE id % 11 = 0")
    runner.start()
    wait_equal(pair, ["t"], runner=runner)
    # Fewer target transactions than source ones: the backlog was grouped.
    xacts = pair.sub_exec("SELECT count(DISTINCT xmin::text) FROM t")[0][0]
    assert xacts < 200, xacts
    end = pair.pub_exec("SELECT pg_current_wal_lsn()::text")[0][0]
    assert runner.stop() == 0
    # The origin is stamped with the last transaction of the last group.
    last = origin_lsn(pair, pair.slot)
    assert last is not None
    assert pair.pub_exec(f"SELECT '{last}'::pg_lsn <= '{end}'::pg_lsn")[0][0]
    # A restart re-applies nothing (a duplicate would hit the primary key and stop).
    runner.start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1000, 'after')")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0


@ONE_PAIR
def test_group_commit_off_applies_one_by_one(pair: Pair) -> None:
    runner = _backlog(pair, group_commit=1)
    for i in range(1, 51):
        pair.pub_exec(f"INSERT INTO t VALUES ({i}, 'v{i}')")
    runner.start()
    wait_equal(pair, ["t"], runner=runner)
    assert pair.sub_exec("SELECT count(DISTINCT xmin::text) FROM t")[0][0] == 50
    assert runner.stop() == 0


@SPEEDUPS
@ONE_PAIR
def test_failed_group_is_replayed_one_by_one_and_names_the_transaction(
    pair: Pair, pure: bool
) -> None:
    runner = _backlog(pair, pure=pure)
    pair.sub_exec("INSERT INTO t VALUES (1000, 'diverged')")
    for i in range(1, 41):
        pair.pub_exec(f"INSERT INTO t VALUES ({i}, 'v{i}')")
    before = pair.pub_exec("SELECT pg_current_wal_lsn()::text")[0][0]
    bad_xid = pair.pub_exec(
        "INSERT INTO t VALUES (999, 'x'), (1000, 'dup') RETURNING txid_current()"
    )[0][0]
    for i in range(41, 61):
        pair.pub_exec(f"INSERT INTO t VALUES ({i}, 'v{i}')")
    runner.start()
    assert runner.wait(120) == 3
    log = runner.log()
    line = [ln for ln in log.splitlines() if " applier: error: " in ln][-1]
    assert "23505" in line and "public.t" in line and "'id': '1000'" in line, line
    assert f"xid={bad_xid}" in line, line
    # Every transaction before the failing one is applied, nothing from it or after it.
    ids = [r[0] for r in pair.sub_exec("SELECT id FROM t ORDER BY id")]
    assert ids == [*range(1, 41), 1000]
    # The origin stops right before the failing transaction.
    last = origin_lsn(pair, pair.slot)
    assert last is not None
    assert pair.pub_exec(f"SELECT '{last}'::pg_lsn <= '{before}'::pg_lsn")[0][0]
