"""The worker's status row stays live across target reconnects (its connection is reopened)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

from conftest import ONE_PAIR, Pair

# The apply tests' helpers (run `applier run` as a real process).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apply"))
from applykit import Runner, wait_equal, wait_for


def _status(cfg_path: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "status", "--config", cfg_path, "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout)
    return out


def _worker(st: dict[str, object]) -> dict[str, object]:
    w = st["worker"]
    assert isinstance(w, dict)
    return w


@ONE_PAIR
def test_status_row_stays_fresh_after_target_backends_are_terminated(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    cfg = pair.write_config()  # status_interval = 1 s
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t SELECT generate_series(1, 10)")
    wait_equal(pair, ["t"], runner=runner)

    killed = pair.sub_exec(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        f"WHERE datname = '{pair.sub_db}' AND application_name LIKE 'applier%'"
    )
    assert killed[0][0] >= 3  # apply, catalog and status connections
    terminated_at = datetime.now().astimezone()
    pair.pub_exec("INSERT INTO t SELECT generate_series(11, 20)")
    wait_equal(pair, ["t"], runner=runner)

    def fresh() -> bool:
        w = _worker(_status(str(cfg)))
        beat = datetime.fromisoformat(str(w["heartbeat_at"]))
        return beat > terminated_at + timedelta(seconds=2)

    wait_for(fresh, 20, "a heartbeat after the reconnect")
    w = _worker(_status(str(cfg)))
    assert w["state"] == "running"
    err = w["last_error"]
    assert isinstance(err, dict), w  # the fault the worker recovered from is shown
    assert err["kind"] in ("ConnectionLost", "TransientError"), err
    assert runner.stop() == 0
