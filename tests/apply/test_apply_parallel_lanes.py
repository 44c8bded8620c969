"""Parallel apply's two lanes on real servers (applier.apply.parallel.lanes).

With ``[apply] adaptive`` (the default) the leader's own session takes ordinary
transactions while applier's CPU is the limit and the pool while the target is.
A backlog alternates the two: phases of many cheap transactions on ``c`` (no
trigger: applier's CPU is what limits them) and phases of keyed writers on ``t``,
whose target trigger sleeps (the target is the limit). applier drains it through
its switches, is SIGKILLed twice on the way, and at the end every table equals
the source's and each change of ``t`` is on the target exactly once (the change
log, parkit.py). The lane's moves are logged, counted in the metrics and shown
by ``applier status``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from applykit import Runner, wait_equal
from conftest import Pair
from parkit import (
    assert_each_change_once,
    changes_on,
    insert_hot_rows,
    keyed_schema,
    metric,
    run_keyed_writers,
    scrape,
    sessions_that_applied,
    wait_until,
)

from applier.localpg import free_port

#: Seconds the target's trigger sleeps a row change of ``t``: the target is the limit.
SLOW = "0.004"
#: Cheap transactions per CPU phase, one row each.
CHEAP = 6_000
TO_POOL = "ordinary transactions now go to the pool"


def _cheap_phase(pair: Pair, first: int) -> None:
    """``CHEAP`` one-row transactions on ``c``, committed one by one on the source."""
    last = first + CHEAP - 1
    pair.pub_exec(
        f"DO $$ BEGIN FOR i IN {first}..{last} LOOP "
        "INSERT INTO c VALUES (i, i); COMMIT; END LOOP; END $$"
    )


def _status(cfg: str) -> tuple[dict[str, object], str]:
    run = [sys.executable, "-m", "applier.cli", "status", "--config", cfg]
    js = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=60)
    text = subprocess.run(run, capture_output=True, text=True, timeout=60)
    return json.loads(js.stdout or "{}"), text.stdout


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_lanes_follow_the_workload_through_kills_each_change_once(pair: Pair) -> None:
    keyed_schema(pair, SLOW)
    pair.both("CREATE TABLE c (id int PRIMARY KEY, v int)")
    pair.pub_exec("ALTER PUBLICATION pub ADD TABLE c")
    port = free_port()
    cfg = pair.write_config(
        apply={"workers": 4, "trusted_triggers": ["public.t"], "status_interval": 0.5},
        metrics={"listen": f"127.0.0.1:{port}"},
    )
    runner = Runner(pair, cfg).start().ready()
    assert runner.stop() == 0  # slot and origin made: what follows is a backlog
    insert_hot_rows(pair)
    for phase in range(2):
        _cheap_phase(pair, phase * CHEAP + 1)
        run_keyed_writers(pair, seed=10 + phase, txns=50)
    total = changes_on(pair.pub_exec)

    logs = []
    for n, share in enumerate((0.3, 0.65)):
        logs.append(f"lanes-{n}.log")
        runner = Runner(pair, cfg, logs[-1]).start()
        goal = share * total
        wait_until(
            lambda g=goal: changes_on(pair.sub_exec) >= g, runner, 180, f"{goal:.0f} changes"
        )
        runner.kill()
    logs.append("lanes-end.log")
    runner = Runner(pair, cfg, logs[-1]).start()
    wait_equal(pair, ["t", "u", "c"], timeout=180, runner=runner)
    assert_each_change_once(pair)

    # A longer target-bound phase in one process (the backlog's may have been cut
    # by the kills before the members opened, on a loaded machine): it goes to the
    # pool, and says so: log, metrics, status.
    run_keyed_writers(pair, seed=20, txns=100)
    wait_until(lambda: TO_POOL in runner.log(), runner, 120, "a move to the pool")
    wait_equal(pair, ["t", "u", "c"], timeout=180, runner=runner)
    assert_each_change_once(pair)
    assert sessions_that_applied(pair) > 1
    samples = scrape(port)
    assert metric(samples, "applier_apply_sessions") == 4
    assert metric(samples, "applier_apply_inline") in (0.0, 1.0)
    switches = metric(samples, "applier_apply_lane_switches_total")
    # This process's moves (a counter starts again with the process).
    assert switches == runner.log().count("ordinary transactions now go to") >= 1

    def beat() -> bool:
        st, _ = _status(str(cfg))
        par = (st.get("worker") or {}).get("parallel")  # type: ignore[attr-defined]
        return bool(par) and "lane_switches" in par

    wait_until(beat, runner, 30, "the heartbeat carries the lane")
    _, text = _status(str(cfg))
    assert "transactions go to the" in text and "lane switches" in text, text
    assert runner.stop() == 0
