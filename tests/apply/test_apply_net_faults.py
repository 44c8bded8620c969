"""Faults beyond SIGKILL: connections cut or stalled (through a TCP proxy), the apply
backend terminated, the source restarted. Each runs pgbench on the source (a txlog
table proves exactly-once) and compares every table at the end.

A stalled connection (no error, no FIN, no RST) must be found and left within a
bounded time: on the target by ``[apply] target_timeout`` (see
applier/apply/target/connection.py), on the source by the stream's ``timeout`` plus the
walsender's ``wal_sender_timeout`` (the old walsender holds the slot until then).
The measured recovery times are printed (``pytest -s``) for the README.
"""

from __future__ import annotations

import re
import time

import pytest
from applykit import Runner, wait_for
from conftest import Pair
from faultproxy import FaultProxy
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from test_apply_faults import _converged, _pgbench, _pgbench_setup

TARGET_TIMEOUT = 3.0
STREAM_TIMEOUT = 3.0


def _via(dsn: str, proxy: FaultProxy, options: str = "") -> str:
    extra = {"port": str(proxy.port)}
    if options:
        extra["options"] = (str(conninfo_to_dict(dsn).get("options") or "") + " " + options).strip()
    return make_conninfo(dsn, **extra)


def _proxied(pair: Pair) -> tuple[FaultProxy, FaultProxy, Runner]:
    src, dst = FaultProxy(pair.pub.port), FaultProxy(pair.sub.port)
    pair.cleanup.extend([src.close, dst.close])
    cfg = pair.write_config(
        # The walsender gives up on a silent client after this (it holds the slot until).
        source={"dsn": _via(pair.pub_dsn, src, "-c wal_sender_timeout=3s")},
        target={"dsn": _via(pair.sub_dsn, dst)},
        apply={"target_timeout": TARGET_TIMEOUT, "timeout": STREAM_TIMEOUT, "status_interval": 1},
    )
    _pgbench_setup(pair)
    return src, dst, Runner(pair, cfg).start().ready()


def _connected_count(runner: Runner) -> int:
    return len(re.findall(r" INFO +applier\.apply: connected ", runner.log()))


def _wait_applied_after(pair: Pair, runner: Runner, timeout: float) -> float:
    """Insert a marker on the source; return the seconds until it is on the target."""
    start = time.monotonic()
    marker = int(start * 1000) % 2_000_000_000
    pair.pub_exec(f"INSERT INTO txlog VALUES ({-marker}, -1)")

    def arrived() -> bool:
        if not runner.alive():
            raise AssertionError(f"applier exited:\n{runner.log()[-4000:]}")
        return bool(pair.sub_exec(f"SELECT 1 FROM txlog WHERE txid = {-marker}"))

    wait_for(arrived, timeout, "the marker to be applied")
    return time.monotonic() - start


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # the client's network handling
def test_connections_cut(pair: Pair) -> None:
    src, dst, runner = _proxied(pair)
    bench = _pgbench(pair, 14)
    for i in range(6):
        time.sleep(2)
        (src if i % 2 else dst).cut()
    assert bench.wait(60) == 0, bench.stderr.read() if bench.stderr else ""
    _converged(pair, runner)
    assert "retrying after a transient error" in runner.log()
    assert _connected_count(runner) >= 4
    assert runner.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # the client's network handling
@pytest.mark.parametrize("side", ["target", "source"])
def test_stalled_connection_is_detected(pair: Pair, side: str) -> None:
    """Half-open connections: nothing comes, nothing fails. The worker must notice
    within its bound, reconnect, and lose or double nothing."""
    src, dst, runner = _proxied(pair)
    bench = _pgbench(pair, 8)
    time.sleep(3)
    before = _connected_count(runner)
    stalled_at = time.monotonic()
    assert (dst if side == "target" else src).stall() >= 1
    try:
        wait_for(lambda: _connected_count(runner) > before, 90, "a new session")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{runner.log()[-5000:]}") from None
    reconnected = time.monotonic() - stalled_at
    applied = _wait_applied_after(pair, runner, 60)
    recovered = time.monotonic() - stalled_at
    print(f"\n{pair.name} {side} stall: reconnected after {reconnected:.1f} s, "
          f"applying again after {recovered:.1f} s")  # fmt: skip
    assert bench.wait(60) == 0, bench.stderr.read() if bench.stderr else ""
    _converged(pair, runner)
    log = runner.log()
    if side == "target":
        assert "silent for" in log or "stalled" in log, log[-3000:]
        # target_timeout, the probe, the retry delay (first retry: < 1 s).
        assert reconnected < TARGET_TIMEOUT + 10 + 5, reconnected
    else:
        # The stream's timeout, then the old walsender's wal_sender_timeout (3 s)
        # while the retries find the slot still active.
        assert reconnected < STREAM_TIMEOUT + 3 + 15, reconnected
    assert applied < 30
    assert runner.stop() == 0


# The client's handling of a lost apply session, as for the other faults here: the
# termination is 57P01 on every target version, and the reconnect runs the start's SQL,
# which every pair's tests run. 15->15 repeated it for ~15 s.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
@pytest.mark.slow
def test_apply_backend_terminated(pair: Pair) -> None:
    pair.write_config()
    _pgbench_setup(pair)
    runner = Runner(pair, pair.write_config(apply={"status_interval": 1})).start().ready()
    bench = _pgbench(pair, 12)
    killed = 0
    for _ in range(4):
        time.sleep(2.5)
        rows = pair.sub.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE application_name = 'applier apply' AND datname = '{pair.sub_db}'"
        )
        killed += len(rows)
    assert bench.wait(60) == 0, bench.stderr.read() if bench.stderr else ""
    _converged(pair, runner)
    assert killed >= 3
    assert "retrying after a transient error" in runner.log()
    assert runner.stop() == 0


@pytest.mark.slow
def test_source_restarted(make_pair: object) -> None:
    pair: Pair = make_pair()  # type: ignore[operator]
    _pgbench_setup(pair)
    runner = Runner(pair, pair.write_config(apply={"status_interval": 1})).start().ready()
    for _ in range(2):
        bench = _pgbench(pair, 4)
        assert bench.wait(60) == 0, bench.stderr.read() if bench.stderr else ""
        pair.pub.restart()
    bench = _pgbench(pair, 3)
    assert bench.wait(60) == 0, bench.stderr.read() if bench.stderr else ""
    _converged(pair, runner)
    assert "retrying after a transient error" in runner.log()
    assert runner.stop() == 0
