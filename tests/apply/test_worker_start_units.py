"""The worker's start-up decisions without a server: who holds the origin.

The same decisions on real servers: test_apply_second_worker.py.
"""

from __future__ import annotations

import subprocess
import sys

from applier.apply.holder import LastWorker, applier_alive, holder_pid, is_other_worker

HERE = ("db1", 4242)
STALE_AFTER = 30.0


def _other(last: LastWorker | None, alive: bool = True) -> bool:
    return is_other_worker(last, HERE, STALE_AFTER, lambda pid: alive)


def test_a_running_worker_on_this_host_is_another_worker() -> None:
    assert _other(LastWorker("db1", 99, "running", 0.5))
    # A worker blocked in a long statement beats late; its process still runs.
    assert _other(LastWorker("db1", 99, "running", 600.0))


def test_the_killed_previous_process_on_this_host_is_waited_for() -> None:
    # systemd restarted it a second ago: the heartbeat is fresh, the process gone.
    assert not _other(LastWorker("db1", 99, "running", 0.5), alive=False)


def test_this_very_process_is_not_another_worker() -> None:
    assert not _other(LastWorker("db1", 4242, "running", 0.5))


def test_a_worker_on_another_host_counts_while_its_heartbeat_is_fresh() -> None:
    assert _other(LastWorker("db2", 4242, "running", 5.0), alive=False)
    assert not _other(LastWorker("db2", 4242, "running", 31.0))
    assert not _other(LastWorker("db2", 4242, "running", None))


def test_a_worker_that_ended_is_not_running() -> None:
    for state in ("stopped", "error"):
        assert not _other(LastWorker("db1", 99, state, 0.5))
    assert not _other(None)
    assert not _other(LastWorker(None, None, "running", None))


def test_the_backend_pid_is_the_messages_last_number() -> None:
    assert holder_pid("replication origin with ID 1 is already active for PID 12302") == 12302
    assert holder_pid("no number") is None


def test_applier_alive() -> None:
    """A live process counts if it is an applier: not a pid reused by something else."""
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    with subprocess.Popen([*sleep, "applier"]) as ours, subprocess.Popen(sleep) as other:
        try:
            assert applier_alive(ours.pid)
            assert not applier_alive(other.pid)
        finally:
            ours.kill()
            other.kill()
    assert not applier_alive(ours.pid)  # reaped: gone
    assert not applier_alive(2**22 + 1)  # above the largest pid_max: no such process
