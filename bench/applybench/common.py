"""What every part of the apply bench shares: the context, SQL, process figures."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from applier.localpg import LocalCluster

DB = "bench"
ROOT = Path(__file__).resolve().parents[2]


class ConsumerTimeout(Exception):
    """A consumer did not bring the marker to the target in time (reported, not fatal)."""


class WrongResult(SystemExit):
    """A consumer's target data differs from the source: the bench stops loudly."""


@dataclass
class Ctx:
    """One server pair and the options of the run."""

    pub: LocalCluster
    sub: LocalCluster
    version: int
    workdir: Path
    scale: float
    timeout: float  # per consumer, for every workload but `full`
    full_timeout: float
    rate: int
    steady_seconds: float
    big_mb: int
    pglogical_error: str | None = None  # why pglogical cannot run here (None: it can)
    #: TOML lines for applier's [apply] section; empty: its defaults (the comparison).
    applier_apply: str = ""
    #: Another applier checkout drained beside this one ("a0"): before/after a change.
    applier_before: Path | None = None
    #: Serve applier's /metrics and read it before each stop (transactions, the
    #: pool's serialised/retried counters): parallel_bench.py, apply_bench.py --applier-workers.
    applier_metrics: bool = False
    #: > 1: applier with ``[apply] workers = N`` drained beside its defaults (key "aw").
    applier_workers: int = 0

    def n(self, full_size: int) -> int:
        return max(1, int(full_size * self.scale))


def log(msg: str) -> None:
    """Progress on stderr, so a long run can be followed while stdout keeps the tables."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(cluster: LocalCluster, sql: str) -> list[tuple[Any, ...]]:
    return cluster.execute(sql, DB)


def one(cluster: LocalCluster, sql: str) -> Any:
    rows = sh(cluster, sql)
    return rows[0][0] if rows else None


def wait_until(check: Callable[[], bool], timeout: float, what: str, step: float = 0.05) -> None:
    """Poll ``check`` until true; ConsumerTimeout after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # e.g. a table locked by a truncate: retry
            if check():
                return
        time.sleep(step)
    raise ConsumerTimeout(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_marker(sub: LocalCluster, marker: int, timeout: float) -> None:
    wait_until(
        lambda: bool(sh(sub, f"SELECT 1 FROM marker WHERE id = {marker}")),
        timeout,
        f"marker {marker} on the target",
    )


def proc_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) a (server) process has used so far; nan if gone."""
    if not pid:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int | None, tid: int | None) -> float:
    """CPU seconds one thread of a live process has used so far; nan if gone."""
    if not pid or not tid:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_hwm_mb(pid: int | None, private: bool = False) -> float:
    """Peak resident set (VmHWM) of a live process in MB; nan if gone.

    A server process's VmHWM counts the shared_buffers pages it touched;
    ``private`` subtracts the shared memory it has mapped now (RssShmem, which
    only grows), leaving about its own peak, the figure comparable to applier's."""
    if not pid:
        return float("nan")
    try:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        hwm = int(status["VmHWM"].split()[0]) / 1024
        return hwm - int(status["RssShmem"].split()[0]) / 1024 if private else hwm
    except (OSError, KeyError, ValueError):
        return float("nan")


def slot_pid(pub: LocalCluster, slot: str) -> int | None:
    pid = one(pub, f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{slot}'")
    return int(pid) if pid else None


def walsender_up(pub: LocalCluster, slot: str, wall0: float) -> dict[str, float]:
    """When the slot's walsender connected, in seconds after the consumer was
    started (``wall0``, time.time()): its start-up. The rest of its ``time`` is
    the drain proper. Empty if no walsender holds the slot now."""
    at = one(
        pub,
        "SELECT extract(epoch FROM a.backend_start) FROM pg_replication_slots s "
        f"JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = '{slot}'",
    )
    return {} if at is None else {"walsender up": float(at) - wall0}


def server_figures(prefix: str, *pids: int | None) -> dict[str, float]:
    """CPU seconds (summed) and peak RSS (the largest, with and without shared
    memory) of server processes, read while they still run."""
    nan = float("nan")
    return {
        f"cpu {prefix}": sum(proc_cpu(p) for p in pids) if pids else nan,
        f"rss {prefix}": max((vm_hwm_mb(p) for p in pids), default=nan),
        f"rss-private {prefix}": max((vm_hwm_mb(p, private=True) for p in pids), default=nan),
    }


class Unsupported(Exception):
    """A consumer cannot run this workload here (pglogical without a key): reported, skipped."""
