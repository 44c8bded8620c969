"""The retry backoff starts over after a healthy session, not once per process."""

from __future__ import annotations

import time

import pytest
from applykit import Runner, steady_inserts, wait_equal, wait_for
from conftest import Pair

#: A reconnect after a healthy session waits at most 0.5 s (tenacity's first
#: step) plus the connection set-up; without the reset the 7th fault of a
#: process waits up to 30 s.
QUICK = 5.0


def _slot(pair: Pair) -> tuple[int | None, str]:
    rows = pair.pub.execute(
        "SELECT active_pid, confirmed_flush_lsn::text FROM pg_replication_slots "
        f"WHERE slot_name = '{pair.slot}'"
    )
    return rows[0][0], rows[0][1]


def _confirmed_past(pair: Pair, lsn: str) -> bool:
    rows = pair.pub.execute(
        f"SELECT confirmed_flush_lsn > '{lsn}'::pg_lsn FROM pg_replication_slots "
        f"WHERE slot_name = '{pair.slot}'"
    )
    return bool(rows[0][0])


# The retry backoff is the client's, the faults the source's walsender (15 on both
# default pairs): 15->15 only repeated the 8 rounds on another target.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
@pytest.mark.slow
def test_reconnects_stay_quick_after_many_faults(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    # Status every 0.2 s: each healthy session shows as confirmed progress sooner (at
    # the default 1 s each of the 8 rounds mostly waited for the next status message).
    runner = Runner(pair, pair.write_config(apply={"status_interval": 0.2})).start().ready()
    took = []
    with steady_inserts(pair):
        for _ in range(8):
            # A healthy session: changes applied and confirmed after the reconnect.
            pid, lsn = _slot(pair)
            wait_for(lambda lsn=lsn: _confirmed_past(pair, lsn), 20, "confirmed progress")
            time.sleep(0.3)
            pid, _ = _slot(pair)
            assert pid is not None
            pair.pub.execute(f"SELECT pg_terminate_backend({pid})")
            started = time.monotonic()

            def back(old: int = pid) -> bool:
                if not runner.alive():
                    raise AssertionError(runner.log()[-3000:])
                now_pid, _ = _slot(pair)
                return now_pid is not None and now_pid != old

            wait_for(back, 45, "the worker to reconnect")
            took.append(round(time.monotonic() - started, 2))
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    assert max(took) < QUICK, f"reconnect times after each fault: {took}"
    print(f"reconnect times after each fault: {took}")
