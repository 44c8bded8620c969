"""A second `applier run` on the origin of a running worker, and a restart after a crash.

The target lets one session at a time own a replication origin; a second
session gets 55006 "replication origin ... is already active for PID n". Two
very different holders give that answer: another worker (refused at once,
exit 3, naming it) and the backend of a worker killed on this host that has
not ended yet (waited for: it ends by itself).
"""

from __future__ import annotations

import socket
import subprocess

from applykit import Runner, wait_equal, wait_for
from conftest import ONE_PAIR, Pair

from applier.errors import EXIT_PERMANENT


def _setup(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")


def _exit_code(runner: Runner, timeout: float) -> int:
    try:
        return runner.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"the second worker still runs after {timeout} s:\n{runner.log()[-3000:]}"
        ) from None


def test_second_worker_is_refused(pair: Pair) -> None:
    _setup(pair)
    cfg = pair.write_config()
    first = Runner(pair, cfg).start().ready()
    assert first.proc is not None
    pair.pub_exec("INSERT INTO t SELECT generate_series(1, 10)")
    wait_equal(pair, ["t"], runner=first)

    second = Runner(pair, cfg, "second.log").start()
    assert _exit_code(second, 30) == EXIT_PERMANENT
    log = second.log()
    refusals = [line for line in log.splitlines() if "another applier worker" in line]
    assert refusals, log[-3000:]
    assert f"pid {first.proc.pid}" in refusals[0], refusals[0]
    assert socket.gethostname() in refusals[0], refusals[0]
    assert "Traceback" not in log

    # The first goes on applying, and its status row still names it: the
    # refused worker wrote nothing there.
    pair.pub_exec("INSERT INTO t SELECT generate_series(11, 20)")
    wait_equal(pair, ["t"], runner=first)
    row = pair.sub_exec("SELECT pid, host, state, last_error FROM applier.worker_status")
    assert row == [(first.proc.pid, socket.gethostname(), "running", None)]
    assert first.stop() == 0


@ONE_PAIR
def test_second_worker_leaves_the_running_workers_spool_files(pair: Pair) -> None:
    """The spool files of the origin belong to the worker that owns it."""
    _setup(pair)
    spool_dir = pair.workdir / "spool"
    cfg = pair.write_config(apply={"spool_dir": str(spool_dir)})
    first = Runner(pair, cfg).start().ready()
    # As a streamed transaction in progress would have it (applier.apply.handlers.spool).
    in_progress = spool_dir / f"{pair.slot}-999.spool"
    in_progress.write_bytes(b"")
    second = Runner(pair, cfg, "second.log").start()
    assert _exit_code(second, 30) == EXIT_PERMANENT
    assert in_progress.exists()
    assert first.stop() == 0


def _apply_backend_waits_on_lock(pair: Pair) -> bool:
    rows = pair.sub.execute(
        "SELECT 1 FROM pg_stat_activity WHERE application_name = 'applier apply' "
        f"AND datname = '{pair.sub_db}' AND wait_event_type = 'Lock'"
    )
    return bool(rows)


def test_restart_waits_for_the_killed_workers_backend(pair: Pair) -> None:
    """systemd restarts a crashed worker while its backend still holds the origin."""
    _setup(pair)
    cfg = pair.write_config()
    first = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t SELECT generate_series(1, 10)")
    wait_equal(pair, ["t"], runner=first)

    # A backend busy in a lock wait does not notice that its client is gone:
    # it holds the origin after the worker is killed, until the lock is free.
    with pair.sub_conn(autocommit=False) as locker:
        locker.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        pair.pub_exec("INSERT INTO t VALUES (11)")
        wait_for(lambda: _apply_backend_waits_on_lock(pair), 30, "the apply backend to wait")
        first.kill()
        second = Runner(pair, cfg, "second.log").start()
        wait_for(lambda: "already active for PID" in second.log(), 30, "the origin to be refused")
        assert second.alive(), second.log()[-3000:]
        locker.rollback()

    pair.pub_exec("INSERT INTO t VALUES (12)")
    wait_equal(pair, ["t"], runner=second)
    assert "another applier worker" not in second.log()
    assert second.stop() == 0
