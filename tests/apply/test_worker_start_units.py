"""The worker's start-up and retry decisions without a server: who holds the
origin, how far apart the retries are, when a fault is logged.

The same on real servers: test_apply_second_worker.py, test_apply_target_restart.py.
"""

from __future__ import annotations

import random
import subprocess
import sys

from applier.apply.backoff import Fault, backoff, backoff_cap
from applier.apply.target.holder import LastWorker, applier_alive, holder_pid, is_other_worker

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


def test_retries_stay_a_second_apart_while_the_fault_is_young() -> None:
    assert backoff_cap(1, 0.0) == 0.5  # the first retry after a healthy session
    assert backoff_cap(2, 1.0) == 1.0
    assert backoff_cap(40, 59.9) == 1.0


def test_a_lasting_fault_is_retried_at_a_tenth_of_its_age_up_to_30_s() -> None:
    assert backoff_cap(80, 60.0) == 6.0
    assert backoff_cap(90, 150.0) == 15.0
    assert backoff_cap(200, 3600.0) == 30.0
    assert backoff_cap(10**6, 10**6) == 30.0  # no overflow, however many attempts


def test_a_wait_lies_between_half_the_cap_and_the_cap() -> None:
    rnd = random.Random(7)
    waits = [backoff(5, 10.0, rnd) for _ in range(200)]
    assert min(waits) >= 0.5 and max(waits) <= 1.0
    assert max(waits) - min(waits) > 0.3  # jittered


def test_a_fault_is_logged_when_it_begins_then_once_a_minute() -> None:
    fault = Fault(since=100.0)
    assert fault.worth_logging(100.0)
    assert not fault.worth_logging(101.0)
    assert not fault.worth_logging(159.0)
    assert fault.worth_logging(160.0)
    assert fault.age(170.0) == 70.0
