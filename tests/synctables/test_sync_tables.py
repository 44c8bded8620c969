"""`applier sync-tables`: a table added to the publication while a writer writes to it and
to other tables and `applier run` runs; crash-and-rerun at each state."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from apply.applykit import Runner, wait_equal, wait_for
from conftest import Pair
from synckit import Writer, finish, setup, slots, state, sync_tables, wait_state

pytestmark = pytest.mark.spark

ROWS = 20_000


def _started(pair: Pair, timeout: float = 20.0) -> tuple[Runner, Writer, Path]:
    """``timeout``: [apply] timeout, a quarter of which bounds the worker's handover pause."""
    setup(pair, ROWS)
    cfg = pair.write_config(apply={"status_interval": 1.0, "timeout": timeout})
    runner = Runner(pair, cfg).start().ready()
    writer = Writer(pair, ROWS).start()
    pair.pub_exec("ALTER PUBLICATION pub ADD TABLE t_new")
    wait_for(lambda: "run `applier sync-tables" in runner.log(), 30, "the worker's warning")
    return runner, writer, cfg


def _assert_done(pair: Pair, runner: Runner, writer: Writer) -> None:
    time.sleep(0.5)
    writer.stop()
    wait_equal(pair, ["a", "t_new"], timeout=60, runner=runner)
    st = state(pair)
    assert st is not None and st[0] in ("syncdone", "ready")
    assert [s for s in slots(pair) if s.startswith("applier_sync_")] == []
    assert pair.sub_exec(
        "SELECT count(*) FROM pg_replication_origin WHERE roname LIKE 'applier_sync_%'"
    ) == [(0,)]
    # The index came after the data, from the source's definition.
    assert pair.sub_exec("SELECT count(*) FROM pg_indexes WHERE indexname = 't_new_n'") == [(1,)]
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-15", "14-18", "17-18"], indirect=True)
def test_added_table_copied_while_everything_streams(pair: Pair) -> None:
    runner, writer, cfg = _started(pair)
    proc = sync_tables(cfg)
    # Other tables are applied while the table copies (never blocked by it).
    wait_state(pair, {"copying"}, proc)
    before = pair.sub_exec("SELECT sum(n) FROM a")[0][0]
    wait_for(lambda: pair.sub_exec("SELECT sum(n) FROM a")[0][0] > before, 30, "a to move on")
    code, out = finish(proc)
    assert code == 0, out
    assert "handed over" in out
    _assert_done(pair, runner, writer)


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_killed_while_copying_then_rerun(pair: Pair) -> None:
    runner, writer, cfg = _started(pair)
    proc = sync_tables(cfg)
    wait_state(pair, {"copying"}, proc)
    time.sleep(1.0)  # into the copy
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    code, out = finish(sync_tables(cfg))
    assert code == 0, out
    _assert_done(pair, runner, writer)


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_killed_in_catchup_and_worker_killed_at_handover(pair: Pair) -> None:
    runner, writer, cfg = _started(pair)
    assert runner.stop() == 0  # no worker: sync-tables catches up and waits for one
    proc = sync_tables(cfg, "--timeout", "60", "--without-worker")
    wait_state(pair, {"syncwait"}, proc)
    time.sleep(1.0)  # the writer goes on: the catch-up applies it
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    # The worker answers the syncwait, pauses at its position, and is killed there.
    runner = Runner(pair, cfg, log_name="applier2.log").start().ready()
    wait_state(pair, {"handover"}, timeout=30)
    runner.kill()
    # Both dead, the handover written. Rerun both: the worker settles the handover
    # before streaming, sync-tables continues from its origin.
    proc = sync_tables(cfg, "--timeout", "90")
    runner = Runner(pair, cfg, log_name="applier3.log").start()
    code, out = finish(proc)
    assert code == 0, out
    _assert_done(pair, runner, writer)


@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_new_partition_of_a_replicated_table(pair: Pair) -> None:
    pair.both(
        "CREATE TABLE p (id int, k int, PRIMARY KEY (id, k)) PARTITION BY RANGE (k);"
        "CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100)"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE p")
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO p SELECT g, g % 100 FROM generate_series(1, 500) g")
    pair.pub_exec("CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (100) TO (200)")
    pair.pub_exec("INSERT INTO p SELECT g, 100 + g % 100 FROM generate_series(1, 500) g")
    wait_for(lambda: "run `applier sync-tables" in runner.log(), 30, "the worker's warning")
    code, out = finish(sync_tables(cfg))
    assert code == 0, out
    pair.pub_exec("UPDATE p SET id = -id WHERE id % 3 = 0; DELETE FROM p WHERE id % 7 = 0")
    wait_equal(pair, ["p", "p2"], runner=runner)
    assert pair.sub_exec("SELECT relispartition FROM pg_class WHERE relname = 'p2'") == [(True,)]
    # Its own primary key, adopted by the parent's (one index, attached).
    assert pair.sub_exec(
        "SELECT count(*), count(h.inhparent) FROM pg_index i "
        "LEFT JOIN pg_inherits h ON h.inhrelid = i.indexrelid WHERE i.indrelid = 'p2'::regclass"
    ) == [(1, 1)]
    assert runner.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_worker_withdraws_a_handover_nobody_finishes(pair: Pair) -> None:
    # [apply] timeout 8 s: the worker pauses 2 s and answers again 6 s after withdrawing
    # (at 20 s: 5 s and 15 s, which this test only waited out).
    runner, writer, cfg = _started(pair, timeout=8.0)
    assert runner.stop() == 0
    proc = sync_tables(cfg, "--timeout", "60", "--without-worker")
    wait_state(pair, {"syncwait"}, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    # The worker answers, waits (a quarter of [apply] timeout = 2 s), withdraws its
    # position and goes on skipping the table, applying the others.
    runner = Runner(pair, cfg, log_name="applier2.log").start().ready()
    wait_state(pair, {"handover"}, timeout=30)
    wait_state(pair, {"catchup"}, timeout=30)
    assert "did not reach the worker's position" in runner.log()
    before = pair.sub_exec("SELECT sum(n) FROM a")[0][0]
    wait_for(lambda: pair.sub_exec("SELECT sum(n) FROM a")[0][0] > before, 30, "a to move on")
    code, out = finish(sync_tables(cfg, "--timeout", "90"))
    assert code == 0, out
    _assert_done(pair, runner, writer)


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_table_removed_from_the_publication_is_forgotten(pair: Pair) -> None:
    runner, writer, cfg = _started(pair)
    proc = sync_tables(cfg)
    wait_state(pair, {"copying"}, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    writer.stop()
    pair.pub_exec("ALTER PUBLICATION pub DROP TABLE t_new")
    code, out = finish(sync_tables(cfg))
    assert code == 0, out
    assert "public.t_new is no longer replicated (state copying): forgotten" in out
    # Forgotten (the worker, still decoding changes from before the DROP TABLE, may
    # record it as skipped again: it is not on the target).
    assert state(pair) in (None, ("skipped", None, None))
    wait_for(lambda: not [s for s in slots(pair) if s.startswith("applier_sync_")], 30, "slot")
    assert runner.alive()
    assert runner.stop() == 0
