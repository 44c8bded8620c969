"""Parallel apply's measure (issue 36, "Measured" 1): an I/O-bound target, the built-in
against applier with 1, 2, 4, 8 workers.

    .venv/bin/python bench/parallel_bench.py [--versions 18] [--scale 1] [--repeat 3]
        [--workers 1,2,4,8] [--workloads simple,tpcb] [--sleep-ms 1]
        [--applier-apply 'LINES'] [--json-out F]

The workloads are in bench/applybench/iowait.py: pgbench -N (``simple``) and
full TPC-B (``tpcb``, every transaction updates one of few branch rows) from 16
clients on the source; on the target an ENABLE ALWAYS row trigger waits
--sleep-ms per applied row change (see its docstring for why that is a fair
stand-in for a target that waits on its disk). Every round drains the same
backlog with the built-in subscriber (on its defaults) and with applier for
each --workers value, in rotating order, and checks the target against the
source after each (apply_bench.py's harness: its rounds and checks).

``workers = 1`` is applier on its defaults, with no [apply] line. A larger
value writes ``[apply] workers = N`` and ``trusted_triggers`` naming the four
pgbench tables: the bench's trigger only sleeps (it touches no row), so telling
applier its triggers touch only their own row is true, and without it every
transaction of these tables would be a barrier, applied one at a time. (A
``trusted_triggers`` line in --applier-apply replaces it.) An applier that does
not know the keys is reported as skipped.

Every applier serves /metrics on a free local port, read just before it stops:
transactions applied and the pool's counters (serialised by key / barrier,
deadlocks, retried), and the CPU of its main thread (the leader) apart from the
whole process (the leader and its sessions' threads).
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import signal
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply_bench import SETTINGS, run_round
from applybench import iowait
from applybench.common import DB, ROOT, Ctx, Unsupported, log, one
from applybench.consumers import Applier, Builtin, Consumer
from applybench.report import Round, median_of, status
from applybench.workloads import Workload

from applier.config import load_config
from applier.errors import ConfigError
from applier.localpg import LocalCluster, local_cluster


@contextlib.contextmanager
def server_pair(version: int, base: Path) -> Iterator[tuple[LocalCluster, LocalCluster]]:
    """apply_bench.py's pair without pglogical (not a consumer here)."""
    log(f"starting a PostgreSQL {version} pair")
    with (
        local_cluster(version, base / f"pg{version}", name="pub", settings=SETTINGS) as pub,
        local_cluster(version, base / f"pg{version}", name="sub", settings=SETTINGS) as sub,
    ):
        pub.create_database(DB)
        sub.create_database(DB)
        yield pub, sub


def slept_ms(sub: LocalCluster) -> float:
    """What one pg_sleep(SLEEP_MS) takes on this target, measured over 500 (timer
    slack and a busy machine make it longer than asked)."""
    seconds = one(sub, "SELECT extract(epoch FROM clock_timestamp() - t) FROM "
                       "(SELECT clock_timestamp() AS t) s, LATERAL (SELECT count(pg_sleep("
                       f"{iowait.SLEEP_MS / 1000.0})) FROM generate_series(1, 500)) w")  # fmt: skip
    return float(seconds) / 500 * 1000


class WorkersApplier(Applier):
    """applier with ``[apply] workers = N`` (N = 1: its defaults, no line at all)."""

    def __init__(self, workers: int) -> None:
        super().__init__(ROOT, f"a{workers}")
        self.workers = workers
        self.label = f"applier, workers = {workers}"

    def config(self, ctx: Ctx) -> Path:
        lines = [ctx.applier_apply] if ctx.applier_apply else []
        if self.workers > 1:
            lines.append(f"workers = {self.workers}")
            if "trusted_triggers" not in ctx.applier_apply:
                lines.append(iowait.trusted_triggers())  # honest: the trigger only sleeps
        return self.write_config(ctx, lines)

    def prepare(self, ctx: Ctx, w: Workload, rnd: int) -> None:
        self.slot = f"{self.key}_{w.name}_{rnd}"
        try:
            load_config(self.config(ctx))
        except ConfigError as e:
            log(f"    {self.label}: {e}")
            raise Unsupported("this applier has no [apply] workers yet") from None
        super().prepare(ctx, w, rnd)


def table(describe: str, n: int, rounds: list[Round], keys: list[tuple[str, str]]) -> list[str]:
    """Per consumer: median time, transactions a second, against the built-in."""
    lines = [
        f"{describe}, median of {len(rounds)} rounds:", "",
        "| consumer | time | txns/s | /built-in | drain after the walsender connected | "
        "CPU: consumer process (leader thread) / its target backends | "
        "serialised by key / barrier; retried |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    base = median_of(rounds, "b", "time")
    for key, label in keys:
        s = status(rounds, key)
        if s:
            why = next((r[key].get("skipped", "") for r in rounds if key in r), "")
            lines.append(f"| {label} | {s} {why} | | | | | |")
            continue
        t = median_of(rounds, key, "time")
        assert t is not None
        drains = [r[key]["time"] - r[key]["walsender up"] for r in rounds
                  if isinstance(r[key].get("walsender up"), float)]  # fmt: skip
        drain = f"{statistics.median(drains):.2f} s" if drains else "-"
        ratio = f"{base / t:.2f}x" if base else "-"
        lines.append(f"| {label} | {t:.2f} s | {n / t:,.0f} | {ratio} | {drain} "
                     f"| {cpu_cell(rounds, key)} | {pool_cell(rounds, key)} |")  # fmt: skip
    return lines


def cpu_cell(rounds: list[Round], key: str) -> str:
    def m(fig: str) -> float:
        return median_of(rounds, key, fig) or 0.0

    if key == "b":
        return f"{m('cpu apply workers'):.2f} s (apply workers)"
    return (f"{m('cpu applier process'):.2f} ({m('cpu applier main thread'):.2f}) / "
            f"{m('cpu target backends'):.2f} s")  # fmt: skip


def pool_cell(rounds: list[Round], key: str) -> str:
    """The pool's counters (medians): how often a transaction waited for others."""
    if key == "b" or median_of(rounds, key, "serialised by key") is None:
        return "-"
    k, b, r = (median_of(rounds, key, f) or 0.0
               for f in ("serialised by key", "serialised by barrier", "retried"))  # fmt: skip
    return f"{k:,.0f} / {b:,.0f}; {r:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--versions", default="18", help="server pairs (default 18)")
    ap.add_argument("--scale", type=float, default=1.0, help="x 20,000 transactions, pgbench scale")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", default="1,2,4,8", help="applier's [apply] workers values")
    ap.add_argument("--workloads", default=",".join(iowait.WORKLOADS),
                    help=f"subset of {','.join(iowait.WORKLOADS)}")  # fmt: skip
    ap.add_argument("--sleep-ms", type=float, default=iowait.SLEEP_MS)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per consumer")
    ap.add_argument("--applier-apply", default="", help="more TOML lines for applier's [apply]")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    iowait.SLEEP_MS = args.sleep_ms
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if unknown := set(names) - set(iowait.WORKLOADS):
        ap.error(f"unknown workloads {sorted(unknown)}; choose from {','.join(iowait.WORKLOADS)}")
    compileall.compile_dir(ROOT / "applier", quiet=1)  # as installed (apply_bench.py says why)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="parallel-bench-") as tmp:
        Path(tmp).chmod(0o755)
        for version in (int(v) for v in args.versions.split(",")):
            with server_pair(version, Path(tmp)) as (pub, sub):
                ctx = Ctx(pub, sub, version, Path(tmp), args.scale, args.timeout, args.timeout,
                          0, 0.0, 0, applier_apply=args.applier_apply,
                          applier_metrics=True)  # fmt: skip
                cons: list[Consumer] = [Builtin()]
                cons += [WorkersApplier(int(w)) for w in args.workers.split(",")]
                for name in names:
                    w = iowait.WORKLOADS[name]
                    rounds = [run_round(ctx, w, cons, r) for r in range(args.repeat)]
                    slept = slept_ms(sub)
                    describe = w.describe(ctx) + f" (one pg_sleep there took {slept:.2f} ms)"
                    results[f"{version} {name}"] = {"describe": describe, "rounds": rounds,
                                                    "slept ms": slept}  # fmt: skip
                    keys = [(c.key, c.label) for c in cons]
                    print(f"\n## PostgreSQL {version} -> {version}: {name}\n")
                    print("\n".join(table(describe, iowait.txns(ctx), rounds, keys)))
                    sys.stdout.flush()
    if args.json_out:
        args.json_out.write_text(json.dumps({"args": vars(args), "results": results},
                                            indent=1, default=str))  # fmt: skip
    log("done")


if __name__ == "__main__":
    main()
