"""sync-tables without a running worker refuses at once (issue 31, item 10).

It used to copy the table and then wait its whole ``--timeout`` (600 s) for a
handover nobody would make, saying nothing. Checked before the copy (and
before Spark starts): nothing is created on the target, no slot on the source.
"""

from __future__ import annotations

import pytest
from conftest import Pair
from synckit import finish, setup, sync_tables

from applier.errors import EXIT_PERMANENT


def _refused(pair: Pair, code: int, out: str) -> None:
    assert code == EXIT_PERMANENT, out
    errors = [line for line in out.splitlines() if " applier: error: " in line]
    assert len(errors) == 1 and "Traceback" not in out, out
    assert "no `applier run` is running" in errors[0] and "--without-worker" in errors[0]
    assert pair.sub_exec("SELECT to_regclass('t_new')") == [(None,)]
    assert pair.pub_exec(
        "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()"
    ) == [(0,)]


@pytest.mark.parametrize("pair", ["15-15"], indirect=True)  # not version-specific
def test_sync_tables_without_a_worker_is_refused_before_copying(pair: Pair) -> None:
    setup(pair, rows=100)
    pair.pub_exec("ALTER PUBLICATION pub ADD TABLE t_new")
    cfg = pair.write_config(logging={"level": "info"})
    proc = sync_tables(cfg, "--timeout", "60")
    try:
        code, out = finish(proc, timeout=60)
    finally:
        proc.kill()
    _refused(pair, code, out)
    assert "never started" in out


@pytest.mark.parametrize("pair", ["15-15"], indirect=True)  # not version-specific
def test_a_new_partitioned_tree_is_a_permanent_refusal(pair: Pair) -> None:
    """sync-tables copies plain tables and new partitions of replicated trees: a
    partition whose root the target lacks is refused at every rerun, so exit 3
    (a restart cannot help), one line naming it and `applier bootstrap`."""
    setup(pair, rows=10)
    pair.pub_exec(
        "CREATE TABLE tree (id int PRIMARY KEY) PARTITION BY RANGE (id);"
        "CREATE TABLE tree_1 PARTITION OF tree FOR VALUES FROM (0) TO (100);"
        "ALTER PUBLICATION pub ADD TABLE tree"
    )
    cfg = pair.write_config(logging={"level": "warning"})
    proc = sync_tables(cfg, "--timeout", "30", "--without-worker")
    try:
        code, out = finish(proc, timeout=60)
    finally:
        proc.kill()
    assert code == EXIT_PERMANENT, out
    errors = [line for line in out.splitlines() if " applier: error: " in line]
    assert len(errors) == 1 and "Traceback" not in out, out
    assert "partition of" in errors[0] and "applier bootstrap" in errors[0], errors[0]
    assert pair.sub_exec("SELECT to_regclass('tree_1')") == [(None,)]
