"""Steady state: pgbench at a fixed rate with one consumer running live at a time.

Each consumer gets its own window (fresh pgbench tables on both sides, same
rate, same length). Every 100 ms the bench reads on the target
``clock_timestamp() - max(mtime)`` of pgbench_history (mtime is the source
transaction's start; same machine, same clock; the target alone gets an index
on mtime so the sample costs no scan). After pgbench ends, the time until the
target has every history row is the catch-up; "kept up" means under 1 s.
pg_recvlogical is left out: it writes no table, so there is no lag to read
the same way (its LSN lag is not comparable).
"""

from __future__ import annotations

import statistics
import subprocess
import time

from .common import DB, ConsumerTimeout, Ctx, Unsupported, log, one, sh, slot_pid, wait_until
from .consumers import Applier, Builtin, Consumer, Figures
from .report import Round
from .workloads import PGBENCH_TABLES, Workload, _create_pgbench, check_target, fingerprint, prepare

STEADY = Workload(
    "steady", PGBENCH_TABLES, PGBENCH_TABLES[:3], _create_pgbench, lambda c: None,
    lambda c: f"pgbench at {c.rate} tps for {c.steady_seconds:.0f} s, one consumer live at a time",
    keyless=("pgbench_history",),
)  # fmt: skip


def go_live(ctx: Ctx, c: Consumer) -> None:
    if isinstance(c, Builtin):
        c.subscribe(ctx)
    elif isinstance(c, Applier):
        c.start(ctx)
    else:  # pglogical: its disabled subscription
        sh(ctx.sub, "SELECT pglogical.alter_subscription_enable('pgls', true)")
    wait_until(lambda: slot_pid(ctx.pub, c.slot) is not None, 60, f"{c.label} to connect")


def lag_window(ctx: Ctx) -> tuple[list[float], float]:
    """Run pgbench at the rate while sampling the lag; the samples and the catch-up time."""
    pub = ctx.pub
    proc = subprocess.Popen(
        [pub.bin("pgbench"), "-h", "127.0.0.1", "-p", str(pub.port), "-U", "postgres", "-n",
         "-c", "4", "-j", "2", "-R", str(ctx.rate), "-T", str(round(ctx.steady_seconds)), DB],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    samples: list[float] = []
    with ctx.sub.connect(DB) as conn:
        while proc.poll() is None:
            row = conn.execute(
                "SELECT extract(epoch FROM clock_timestamp()::timestamp - max(mtime))::float8 "
                "FROM pgbench_history"
            ).fetchone()
            if row and row[0] is not None:
                samples.append(float(row[0]))
            time.sleep(0.1)
    if proc.returncode != 0:
        raise SystemExit(
            f"pgbench -R failed: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}"
        )
    t_end = time.monotonic()
    want = one(pub, "SELECT count(*) FROM pgbench_history")
    wait_until(
        lambda: one(ctx.sub, "SELECT count(*) FROM pgbench_history") == want,
        max(120.0, ctx.steady_seconds * 5),
        "the target to catch up",
    )
    return samples, time.monotonic() - t_end


def one_window(ctx: Ctx, c: Consumer, rnd: int) -> Figures:
    prepare(ctx, STEADY)
    sh(ctx.sub, "CREATE INDEX ON pgbench_history (mtime)")
    try:
        c.prepare(ctx, STEADY, rnd)
        go_live(ctx, c)
        time.sleep(1)  # past the start-up: the lag is the steady state's
        samples, catch_up = lag_window(ctx)
        check_target(ctx, STEADY, fingerprint(ctx.pub, STEADY), c.label)
    finally:
        if isinstance(c, Applier) and c.proc is not None:
            c.stop(time.time())
        c.cleanup(ctx)
    q = (
        statistics.quantiles(samples, n=100, method="inclusive")
        if len(samples) > 1
        else samples * 99
    )
    return {"p50": statistics.median(samples), "p99": q[98], "max": max(samples),
            "end": samples[-1], "catch-up": catch_up, "samples": float(len(samples))}  # fmt: skip


def run_steady(ctx: Ctx, live: list[Consumer], repeat: int) -> list[Round]:
    """``repeat`` rounds; in each every live consumer gets one window, order rotated."""
    rounds: list[Round] = []
    for rnd in range(repeat):
        k = rnd % len(live)
        out: Round = {}
        for c in live[k:] + live[:k]:
            log(f"pg{ctx.version} steady round {rnd + 1}/{repeat}: {c.label} live")
            try:
                f = out[c.key] = one_window(ctx, c, rnd)
                log(f"    {c.label}: lag p50 {f['p50']:.3f} s p99 {f['p99']:.3f} s, "
                    f"catch-up {f['catch-up']:.2f} s")  # fmt: skip
            except ConsumerTimeout as e:
                out[c.key] = {"timeout": ctx.timeout, "why": str(e)}
                log(f"    {c.label}: {e}")
            except Unsupported as e:
                out[c.key] = {"skipped": str(e)}
                log(f"    {c.label}: skipped: {e}")
        rounds.append(out)
    return rounds
