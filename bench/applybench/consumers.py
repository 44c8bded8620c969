"""The consumers that drain one backlog: pg_recvlogical, built-in, pglogical 2, applier.

Each has ``prepare`` (before the workload: its slot, or for pglogical its
disabled subscription), ``drain`` (timed from its start until the marker is
on the target; returns the figures) and ``cleanup`` (drops what it made, even
after a timeout). Server processes' CPU and peak RSS are read from /proc just
before they are stopped; the applier's and pg_recvlogical's from os.wait4.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

from .common import (
    DB,
    ROOT,
    ConsumerTimeout,
    Ctx,
    one,
    proc_cpu,
    server_figures,
    sh,
    slot_pid,
    thread_cpu,
    wait_marker,
    wait_until,
    walsender_up,
)  # fmt: skip
from .workloads import Workload

Figures = dict[str, float]

#: applier's /metrics figures kept (name as served -> figure name in the results).
METRICS = {
    "applier_applied_transactions_total": "transactions",
    'applier_apply_serialised_total{reason="key"}': "serialised by key",
    'applier_apply_serialised_total{reason="barrier"}': "serialised by barrier",
    "applier_apply_deadlocks_total": "deadlocks",
    "applier_apply_retried_total": "retried",
}


def free_port() -> int:
    """A TCP port nobody listens on now (for applier's metrics endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Figures:
    """The :data:`METRICS` applier serves on ``port`` now (empty if it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: Figures = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in METRICS:
            out[METRICS[name]] = float(value)
    return out


def builtin_defaults(version: int) -> dict[str, str]:
    """What the built-in subscriber sends on its defaults (worker.c, libpqwalreceiver.c):
    15 - proto_version 3, no streaming, no binary; 16+ - proto_version 4,
    streaming = parallel (the default from 18), origin 'any'."""
    if version >= 18:
        return {"proto_version": "4", "streaming": "parallel", "origin": "any"}
    if version >= 16:
        return {"proto_version": "4", "origin": "any"}
    return {"proto_version": "3"}


def applier_defaults(server_version_num: int) -> dict[str, str]:
    """The START_REPLICATION options `applier run` negotiates on its defaults, computed
    by the tree's own code (so the floor follows whatever applier is being measured)."""
    from applier.config import ApplyConfig, SourceConfig
    from applier.stream.client import StreamOptions, negotiate

    apply = ApplyConfig()
    opts = StreamOptions(
        slot="x",
        publications=("pub",),
        binary=apply.binary,
        messages=True,
        streaming=apply.streaming,
        two_phase=apply.two_phase,
        origin=SourceConfig(dsn="", publications=["pub"]).origin,
    )
    return {
        k: v for k, v in negotiate(server_version_num, opts).options if k != "publication_names"
    }


def wait4_timeout(proc: subprocess.Popen[bytes], timeout: float) -> resource.struct_rusage | None:
    """The child's own rusage once it exits; None (still running) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere already (its rusage is gone)
            proc.returncode = 0
            return resource.struct_rusage((0,) * 16)
        if pid:
            proc.returncode = 0  # reaped here: Popen must not wait for it again
            return usage
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def stop_child(proc: subprocess.Popen[bytes]) -> resource.struct_rusage:
    """SIGTERM, then SIGKILL after 15 s; the child's rusage."""
    if proc.returncode is not None:
        try:
            return os.wait4(proc.pid, os.WNOHANG)[2]
        except ChildProcessError:  # reaped already (its rusage was read then)
            return resource.struct_rusage((0,) * 16)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    usage = wait4_timeout(proc, 15)
    if usage is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        usage = os.wait4(proc.pid, 0)[2]
        proc.returncode = -9
    return usage


class Consumer:
    key = ""
    label = ""

    def prepare(self, ctx: Ctx, w: Workload, rnd: int) -> None:
        self.slot = f"{self.key}_{w.name}_{rnd}"
        sh(ctx.pub, f"SELECT pg_create_logical_replication_slot('{self.slot}', 'pgoutput')")

    def drain(self, ctx: Ctx, marker: int, end_lsn: str, timeout: float) -> Figures:
        raise NotImplementedError

    def cleanup(self, ctx: Ctx) -> None:
        with contextlib.suppress(Exception):
            if one(ctx.pub, f"SELECT count(*) FROM pg_replication_slots "
                            f"WHERE slot_name = '{self.slot}'"):  # fmt: skip
                wait_until(lambda: slot_pid(ctx.pub, self.slot) is None, 30, "slot released")
                sh(ctx.pub, f"SELECT pg_drop_replication_slot('{self.slot}')")

    @property
    def verifies(self) -> bool:  # whether the target is checked after drain
        return True


class RecvLogical(Consumer):
    """The walsender's own drain time: a consumer that reads and discards."""

    def __init__(self, key: str, label: str, options: dict[str, str]) -> None:
        self.key, self.label, self.options = key, label, options

    @property
    def verifies(self) -> bool:
        return False

    def drain(self, ctx: Ctx, marker: int, end_lsn: str, timeout: float) -> Figures:
        opts = [a for k, v in {**self.options, "publication_names": "pub"}.items()
                for a in ("-o", f"{k}={v}")]  # fmt: skip
        pub = ctx.pub
        t0, wall0 = time.monotonic(), time.time()
        proc = subprocess.Popen(
            [pub.bin("pg_recvlogical"), "-h", "127.0.0.1", "-p", str(pub.port), "-U", "postgres",
             "-d", DB, "-S", self.slot, "--start", "-E", end_lsn, "-f", "/dev/null",
             *opts, "--no-loop"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        out: Figures = {}
        usage, wal = None, None
        while usage is None:  # read the walsender (from /proc) while it still runs
            if not wal and (wal := slot_pid(pub, self.slot)):
                out.update(walsender_up(pub, self.slot, wall0))
            figs = server_figures("walsender", wal)
            if wal and not math.isnan(figs["cpu walsender"]):
                out.update(figs)
            usage = wait4_timeout(proc, 0.01)
            if usage is None and time.monotonic() - t0 > timeout:
                stop_child(proc)
                raise ConsumerTimeout(f"pg_recvlogical did not reach {end_lsn} in {timeout:.0f} s")
        out["time"] = time.monotonic() - t0
        out["cpu pg_recvlogical"] = usage.ru_utime + usage.ru_stime
        return out


class Builtin(Consumer):
    key, label = "b", "built-in"

    def subscribe(self, ctx: Ctx) -> None:
        """The built-in on its defaults: only what attaching to our slot needs."""
        opts = f"copy_data = false, create_slot = false, slot_name = '{self.slot}'"
        sh(ctx.sub, f"CREATE SUBSCRIPTION bsub CONNECTION '{ctx.pub.dsn(DB)}' "
                    f"PUBLICATION pub WITH ({opts})")  # fmt: skip

    def drain(self, ctx: Ctx, marker: int, end_lsn: str, timeout: float) -> Figures:
        t0, wall0 = time.monotonic(), time.time()
        self.subscribe(ctx)
        wait_marker(ctx.sub, marker, timeout)
        out: Figures = {"time": time.monotonic() - t0}
        out.update(walsender_up(ctx.pub, self.slot, wall0))
        # The leader and any parallel apply workers (16+), read before they stop.
        sql = "SELECT pid FROM pg_stat_subscription WHERE subname = 'bsub' AND pid IS NOT NULL"
        pids = [p for (p,) in sh(ctx.sub, sql)]
        out.update(server_figures("apply workers", *pids))
        out.update(server_figures("walsender", slot_pid(ctx.pub, self.slot)))
        return out

    def cleanup(self, ctx: Ctx) -> None:
        with contextlib.suppress(Exception):
            if one(ctx.sub, "SELECT count(*) FROM pg_subscription WHERE subname = 'bsub'"):
                sh(ctx.sub, "ALTER SUBSCRIPTION bsub DISABLE")
                # A worker in the middle of a long transaction stops only when told to.
                sh(ctx.sub, "SELECT pg_terminate_backend(pid) FROM pg_stat_subscription "
                            "WHERE subname = 'bsub' AND pid IS NOT NULL")  # fmt: skip
                sh(ctx.sub, "ALTER SUBSCRIPTION bsub SET (slot_name = NONE)")
                sh(ctx.sub, "DROP SUBSCRIPTION bsub")
        super().cleanup(ctx)


class Applier(Consumer):
    key, label = "a", "applier"

    def __init__(self, tree: Path = ROOT, key: str = "a", extra: tuple[str, ...] = ()) -> None:
        """``tree``: the checkout whose applier runs (another one: ``--applier-before``);
        ``extra``: [apply] lines besides --applier-apply's (``--applier-workers``)."""
        super().__init__()
        self.tree, self.key, self.extra = tree, key, extra
        if extra:
            self.label = f"applier, {', '.join(extra)}"
        # Its own code first on the path: ``python -m applier.cli`` imports that tree.
        self.env = {**os.environ, "PYTHONPATH": str(tree)}

    def config(self, ctx: Ctx) -> Path:
        """applier's defaults: no [apply] section at all (json log for the start-up line),
        unless --applier-apply asks for one (to measure a setting, not to compare)."""
        return self.write_config(
            ctx, [ctx.applier_apply, *self.extra] if ctx.applier_apply else list(self.extra)
        )

    def write_config(self, ctx: Ctx, apply: list[str]) -> Path:
        """The config file: source, target, json log, these [apply] lines, and
        with ``ctx.applier_metrics`` a [metrics] endpoint on a free port."""
        cfg = ctx.workdir / f"{self.slot}.toml"
        self.metrics_port = free_port() if ctx.applier_metrics else None
        port = self.metrics_port
        cfg.write_text(
            f'[source]\ndsn = "{ctx.pub.dsn(DB)}"\npublications = ["pub"]\nslot = "{self.slot}"\n'
            f'[target]\ndsn = "{ctx.sub.dsn(DB)}"\norigin = "o_{self.slot}"\n'
            '[logging]\nlevel = "info"\nformat = "json"\n'
            + ("[apply]\n" + "\n".join(apply) + "\n" if apply else "")
            + (f'[metrics]\nlisten = "127.0.0.1:{port}"\n' if port else "")
        )
        return cfg

    def prepare(self, ctx: Ctx, w: Workload, rnd: int) -> None:
        super().prepare(ctx, w, rnd)
        self.cfg = self.config(ctx)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ctx: Ctx) -> tuple[float, float]:
        # The applier schema on the target is set up before (as the built-in's
        # catalogs exist before CREATE SUBSCRIPTION): not part of the drain. Each
        # applier sets up its own just before it runs: a checkout of --applier-before
        # may know fewer migrations than the one before it (it refuses a newer one).
        sh(ctx.sub, "DROP SCHEMA IF EXISTS applier CASCADE")
        subprocess.run(
            [sys.executable, "-m", "applier.cli", "migrate", "--config", str(self.cfg)],
            cwd=self.tree, env=self.env, check=True, capture_output=True,
        )  # fmt: skip
        self.logfile = ctx.workdir / f"{self.slot}.log"
        t0, wall0 = time.monotonic(), time.time()
        with open(self.logfile, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "applier.cli", "run", "--config", str(self.cfg)],
                cwd=self.tree, env=self.env, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        return t0, wall0

    def figures_before_stop(self, ctx: Ctx) -> Figures:
        pids = [p for (p,) in sh(ctx.sub, "SELECT pid FROM pg_stat_activity "
                                          "WHERE application_name LIKE 'applier%'")]  # fmt: skip
        out = {"cpu target backends": sum(proc_cpu(p) for p in pids)}
        out.update(server_figures("walsender", slot_pid(ctx.pub, self.slot)))
        if self.proc is not None:
            # The worker (with N sessions: the leader) runs on the main thread;
            # parallel apply's members are other threads of the same process.
            out["cpu applier main thread"] = thread_cpu(self.proc.pid, self.proc.pid)
        port = getattr(self, "metrics_port", None)
        if port:
            out.update(scrape(port))
        return out

    def stop(self, wall0: float) -> Figures:
        assert self.proc is not None
        usage = stop_child(self.proc)
        self.proc = None
        out = {"cpu applier process": usage.ru_utime + usage.ru_stime,
               "rss applier process": usage.ru_maxrss / 1024}  # fmt: skip
        for line in self.logfile.read_text(errors="replace").splitlines():
            if line.startswith("{") and json.loads(line).get("msg") == "replication started":
                ts = datetime.fromisoformat(json.loads(line)["ts"]).timestamp()
                out["start-up"] = ts - wall0  # exec until START_REPLICATION was sent
                break
        return out

    def drain(self, ctx: Ctx, marker: int, end_lsn: str, timeout: float) -> Figures:
        t0, wall0 = self.start(ctx)

        started: Figures = {}

        def arrived() -> bool:  # or applier gave up: no waiting out the timeout for it
            if not started and slot_pid(ctx.pub, self.slot):
                started.update(self.cpu_at_start())
            return self.exited() or bool(sh(ctx.sub, f"SELECT 1 FROM marker WHERE id = {marker}"))

        wait_until(arrived, timeout, f"marker {marker} on the target")
        if self.exited():
            raise SystemExit(f"applier exited: {self.log_tail()}")
        elapsed = time.monotonic() - t0
        out = self.figures_before_stop(ctx)
        out.update(started)
        out.update(walsender_up(ctx.pub, self.slot, wall0))
        out.update(self.stop(wall0))
        out["time"] = elapsed
        return out

    def cpu_at_start(self) -> Figures:
        """CPU the process (and its main thread) used until its walsender appeared:
        the start-up (imports, connections), which a per-transaction figure leaves out."""
        assert self.proc is not None
        pid = self.proc.pid
        return {"cpu applier process at start": proc_cpu(pid),
                "cpu applier main thread at start": thread_cpu(pid, pid)}  # fmt: skip

    def exited(self) -> bool:
        """Whether the child has exited, without reaping it (its rusage is read later)."""
        assert self.proc is not None
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, self.proc.pid, flags) is not None

    def log_tail(self) -> str:
        return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-15:])

    def cleanup(self, ctx: Ctx) -> None:
        if getattr(self, "proc", None) is not None:
            assert self.proc is not None
            stop_child(self.proc)
            self.proc = None
        # Every origin with progress holds a replication state slot on the target
        # (18: max_active_replication_origins, default 10): drop ours and, with
        # [apply] workers, its sessions' (o_<slot>.<n>), as DROP SUBSCRIPTION
        # drops the built-in's. Left behind, 2 rounds of workers = 4 fill them.
        with contextlib.suppress(Exception):
            sh(ctx.sub, f"SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin "
                        f"WHERE roname = 'o_{self.slot}' "
                        f"OR starts_with(roname, 'o_{self.slot}.')")  # fmt: skip
        super().cleanup(ctx)


def consumers(ctx: Ctx, server_version_num: int) -> list[Consumer]:
    from .pglogical import Pglogical

    out: list[Consumer] = [
        RecvLogical("rb", "floor (built-in's options)", builtin_defaults(ctx.version)),
        RecvLogical("ra", "floor (applier's options)", applier_defaults(server_version_num)),
        Builtin(),
    ]
    if ctx.version == 15:
        out.append(Pglogical())
    if ctx.applier_before is not None:
        out.append(Applier(ctx.applier_before, "a0"))
    out.append(Applier())
    if ctx.applier_workers > 1:
        out.append(Applier(ROOT, "aw", (f"workers = {ctx.applier_workers}",)))
    return out
