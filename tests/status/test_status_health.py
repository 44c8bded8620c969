"""``applier status`` exit codes for each state of a real worker and real servers.

0 healthy and running; 1 a server unreachable; 3 the worker stopped on an
error; 4 no worker running or its heartbeat stale; 5 the slot missing,
invalidated or retaining more WAL than ``[status] max_retained_wal``. When
several hold: the first of 1, 5, 3, 4.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TWO_SOURCES, Pair

from applier.schema import upgrade_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apply"))
from applykit import Runner, wait_equal, wait_for


def _status(cfg: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "status", "--config", str(cfg), "--json", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout or "{}"), proc.stderr


def _text(cfg: Path) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "status", "--config", str(cfg)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout


def _code(cfg: Path) -> int:
    rc, st, err = _status(cfg)
    assert st.get("code") == rc, (rc, st, err)
    return rc


def _table(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_running_is_0_stopped_is_4(pair: Pair) -> None:
    _table(pair)
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1, 'a')")
    wait_equal(pair, ["t"], runner=runner)
    rc, st, err = _status(cfg)
    assert rc == 0, (st, err)
    assert st["code"] == 0 and st["health"] == "healthy"
    assert runner.stop() == 0
    rc, st, _ = _status(cfg)
    assert rc == 4 and st["health"] == "not_running"
    assert "stopped" in st["reason"]


@pytest.mark.bare_target
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_never_started_is_4(pair: Pair) -> None:
    _table(pair)
    pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput')")
    cfg = pair.write_config()
    rc, st, _ = _status(cfg)  # no applier schema on the target at all
    assert rc == 4, st
    upgrade_target(pair.sub_dsn)
    rc, st, _ = _status(cfg)  # the schema, but no worker row
    assert rc == 4, st
    assert "no worker" in st["reason"]


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_apply_error_is_3_with_the_error_and_what_to_do(pair: Pair) -> None:
    _table(pair)
    pair.sub_exec("INSERT INTO t VALUES (2, 'target only')")
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (2, 'from the source')")
    assert runner.wait(60) == 3
    rc, st, _ = _status(cfg)
    assert rc == 3, st
    assert st["health"] == "error"
    assert "duplicate key" in st["reason"], st["reason"]
    assert st["skip_command"] and st["skip_command"] in st["hint"]
    rc, text = _text(cfg)
    assert rc == 3
    assert "duplicate key" in text and st["skip_command"] in text


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_killed_worker_is_4_once_its_heartbeat_is_stale(pair: Pair) -> None:
    _table(pair)
    cfg = pair.write_config()  # status_interval = 1 s: stale after 3 s
    runner = Runner(pair, cfg).start().ready()
    wait_for(lambda: _code(cfg) == 0, 20, "a healthy status")
    runner.kill()  # SIGKILL: the row stays 'running'
    killed = time.monotonic()
    wait_for(lambda: _code(cfg) == 4, 15, "a stale heartbeat")
    assert time.monotonic() - killed > 2  # not before the heartbeat aged
    _, st, _ = _status(cfg)
    assert st["worker"]["state"] == "running"
    assert "heartbeat" in st["reason"]


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_dropped_slot_is_5(pair: Pair) -> None:
    _table(pair)
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    assert runner.stop() == 0
    assert _code(cfg) == 4
    pair.pub_exec(f"SELECT pg_drop_replication_slot('{pair.slot}')")
    rc, st, _ = _status(cfg)
    assert rc == 5 and st["health"] == "slot"  # 5 before 4
    assert "does not exist" in st["reason"]


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_retained_wal_over_the_threshold_is_5(pair: Pair) -> None:
    _table(pair)
    cfg = pair.write_config()
    tiny = pair.write_config(status={"max_retained_wal": "1kB"})
    runner = Runner(pair, cfg).start().ready()
    assert runner.stop() == 0
    pair.pub_exec("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 1000) g")
    assert _code(cfg) == 4  # 16GB by default
    rc, st, _ = _status(tiny)
    assert rc == 5, st
    assert "retain" in st["reason"] and "max_retained_wal" in st["reason"]
    off = pair.write_config(status={"max_retained_wal": 0})
    assert _code(off) == 4


@TWO_SOURCES
def test_slot_failover_flag_is_shown(any_pair: Pair) -> None:
    pair = any_pair
    failover = pair.pub.version >= 17
    args = ", false, false, true" if failover else ""
    pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput'{args})")
    cfg = pair.write_config()
    _, st, _ = _status(cfg)
    assert st["slot"]["failover"] is (True if failover else None)
    _, text = _text(cfg)
    assert ("failover" in text) and (("True" in text) if failover else True)


@pytest.mark.slow
def test_server_down_is_1_before_everything_else(make_pair: Any) -> None:
    pair: Pair = make_pair()
    _table(pair)
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    wait_for(lambda: _code(cfg) == 0, 20, "a healthy status")
    pair.pub.stop()
    rc, st, _ = _status(cfg)
    assert rc == 1 and st["health"] == "unreachable"
    assert "source unreachable" in st["reason"]
    assert runner.stop() == 0
    assert _code(cfg) == 1  # source down and no worker: 1, not 4

    pair.pub.start()
    assert _code(cfg) == 4
    # Invalidate the slot: it may keep no WAL, and the WAL it needs goes.
    pair.pub_exec("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
    pair.pub_exec("SELECT pg_reload_conf()")
    for _ in range(4):
        pair.pub_exec("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 1000) g")
        pair.pub_exec("DELETE FROM t")
        pair.pub_exec("SELECT pg_switch_wal()")
    pair.pub_exec("CHECKPOINT")
    wal = pair.pub_exec(
        f"SELECT wal_status FROM pg_replication_slots WHERE slot_name = '{pair.slot}'"
    )
    assert wal == [("lost",)]
    rc, st, _ = _status(cfg)
    assert rc == 5 and "invalidated" in st["reason"], st
    pair.sub.stop()
    assert _code(cfg) == 1  # target down: 1 before 5
