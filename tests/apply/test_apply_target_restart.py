"""How soon the worker resumes once a restarted target accepts connections again.

The retries' spacing decides it: with a backoff that grows with each attempt,
a fault of 20 s left the worker sleeping for up to 30 s while the target was
already back. The test restarts the target (an immediate stop, down 1 and
20 s, under a steady stream of source transactions), records when the server
first accepts a fresh connection, and when the next source transaction shows
up applied on it.

Down 1 s and 20 s, not also 5 s: while a fault is younger than a minute the
retries are spaced alike whatever its age (``backoff_cap``, unit-tested for
attempts 1, 2 and 40 in tests/apply/test_worker_start_units.py), so a third
outage in that range checked the same spacing again, for ~10 s; 20 s is the
outage the former exponential backoff failed (a retry due ~11 s after the
target was back), 1 s the common short restart.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from applykit import Runner, steady_inserts, wait_equal, wait_for
from conftest import Pair

#: Seconds from the target's first accepted connection to the next applied
#: transaction: the retries are spaced at most 1 s apart while a fault is
#: younger than a minute, plus a session's set-up; generous for a loaded machine.
RESUMED_WITHIN = 4.0
DOWN_FOR = (1, 20)


def _max_id(conn: psycopg.Connection[object]) -> int:
    row = conn.execute("SELECT coalesce(max(id), 0) FROM t").fetchone()
    assert row is not None
    return int(row[0])  # type: ignore[call-overload]


def _caught_up(pair: Pair) -> bool:
    src = pair.pub_exec("SELECT coalesce(max(id), 0) FROM t")[0][0]
    return bool(pair.sub_exec("SELECT coalesce(max(id), 0) FROM t")[0][0] >= src)


def _first_accepted(pair: Pair, deadline: float) -> tuple[float, int]:
    """Poll with fresh connections: when the target first accepts one, and the
    last applied id as it is then."""
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(pair.sub_dsn, autocommit=True, connect_timeout=2) as conn:
                at = time.monotonic()
                return at, _max_id(conn)
        except psycopg.OperationalError:
            time.sleep(0.05)
    raise AssertionError("the target did not come back")


def _next_applied(pair: Pair, after: int, runner: Runner, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    with psycopg.connect(pair.sub_dsn, autocommit=True) as conn:
        while _max_id(conn) <= after:
            if not runner.alive() or time.monotonic() > deadline:
                raise AssertionError(f"nothing applied after the restart:\n{runner.log()[-3000:]}")
            time.sleep(0.05)
    return time.monotonic()


def _restart(pair: Pair, runner: Runner, down: float) -> float:
    """Stop the target for ``down`` s; seconds from its first accepted
    connection to the next applied transaction."""
    pair.sub.stop("immediate")
    time.sleep(down)
    starter = threading.Thread(target=pair.sub.start)
    starter.start()
    accepted, applied_then = _first_accepted(pair, time.monotonic() + 60)
    resumed = _next_applied(pair, applied_then, runner, 60)
    starter.join(60)
    return resumed - accepted


@pytest.mark.slow
def test_resumes_soon_after_a_target_restart(make_pair: object) -> None:
    pair: Pair = make_pair()  # type: ignore[operator]
    pair.both("CREATE TABLE t (id bigint PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    runner = Runner(pair, pair.write_config()).start().ready()
    took: dict[float, float] = {}
    with steady_inserts(pair):
        for down in DOWN_FOR:
            # Applying (and confirming) again first: a healthy session, as before a
            # fault in production.
            wait_for(lambda: _caught_up(pair), 60, "the worker to catch up")
            time.sleep(2)
            took[down] = round(_restart(pair, runner, down), 2)
    print(f"target down (s) -> resumed after the first accepted connection (s): {took}")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    assert max(took.values()) <= RESUMED_WITHIN, took
