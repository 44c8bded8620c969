"""Parallel apply's measure (issue 36, "Measured" 1): an I/O-bound target, the built-in
against applier with 1, 2, 4, 8 workers.

    .venv/bin/python bench/parallel_bench.py [--versions 18] [--scale 0.25] [--repeat 3]
        [--workers 1,2,4,8] [--sleep-ms 1] [--applier-apply 'LINES'] [--json-out F]

The workload is bench/applybench/iowait.py: pgbench -N from 16 clients on the
source; on the target an ENABLE ALWAYS row trigger waits --sleep-ms per
applied row change (see its docstring for why that is a fair stand-in for a
target that waits on its disk). Every round drains the same backlog with the
built-in subscriber (on its defaults) and with applier for each --workers
value, in rotating order, and checks the target against the source after each
(apply_bench.py's harness: its server pairs, rounds and checks). ``workers =
1`` is applier on its defaults, with no [apply] line; a larger value writes
``[apply] workers = N``, and an applier that does not know the key yet is
reported as skipped, so the same command measures them once it does.
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
        cfg = ctx.workdir / f"{self.slot}.toml"
        cfg.write_text(
            f'[source]\ndsn = "{ctx.pub.dsn("bench")}"\npublications = ["pub"]\n'
            f'slot = "{self.slot}"\n[target]\ndsn = "{ctx.sub.dsn("bench")}"\n'
            f'origin = "o_{self.slot}"\n[logging]\nlevel = "info"\nformat = "json"\n'
            + ("[apply]\n" + "\n".join(lines) + "\n" if lines else "")
        )
        return cfg

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
        "CPU: consumer process / its target backends |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    base = median_of(rounds, "b", "time")
    for key, label in keys:
        s = status(rounds, key)
        if s:
            why = next((r[key].get("skipped", "") for r in rounds if key in r), "")
            lines.append(f"| {label} | {s} {why} | | | | |")
            continue
        t = median_of(rounds, key, "time")
        assert t is not None
        drains = [r[key]["time"] - r[key]["walsender up"] for r in rounds
                  if isinstance(r[key].get("walsender up"), float)]  # fmt: skip
        drain = f"{statistics.median(drains):.2f} s" if drains else "-"
        cpu = (
            f"{median_of(rounds, key, 'cpu applier process') or 0:.2f} / "
            f"{median_of(rounds, key, 'cpu target backends') or 0:.2f} s"
            if key != "b"
            else f"{median_of(rounds, key, 'cpu apply workers') or 0:.2f} s (apply workers)"
        )
        ratio = f"{base / t:.2f}x" if base else "-"
        lines.append(f"| {label} | {t:.2f} s | {n / t:,.0f} | {ratio} | {drain} | {cpu} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--versions", default="18", help="server pairs (default 18)")
    ap.add_argument("--scale", type=float, default=1.0, help="x 20,000 transactions, pgbench scale")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", default="1,2,4,8", help="applier's [apply] workers values")
    ap.add_argument("--sleep-ms", type=float, default=iowait.SLEEP_MS)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per consumer")
    ap.add_argument("--applier-apply", default="", help="more TOML lines for applier's [apply]")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    iowait.SLEEP_MS = args.sleep_ms
    workload = iowait.IOWAIT
    compileall.compile_dir(ROOT / "applier", quiet=1)  # as installed (apply_bench.py says why)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="parallel-bench-") as tmp:
        Path(tmp).chmod(0o755)
        for version in (int(v) for v in args.versions.split(",")):
            with server_pair(version, Path(tmp)) as (pub, sub):
                ctx = Ctx(pub, sub, version, Path(tmp), args.scale, args.timeout, args.timeout,
                          0, 0.0, 0, applier_apply=args.applier_apply)  # fmt: skip
                cons: list[Consumer] = [Builtin()]
                cons += [WorkersApplier(int(w)) for w in args.workers.split(",")]
                rounds = [run_round(ctx, workload, cons, r) for r in range(args.repeat)]
                slept = slept_ms(sub)
            describe = workload.describe(ctx) + f" (one pg_sleep there took {slept:.2f} ms)"
            results[str(version)] = {"describe": describe, "rounds": rounds, "slept ms": slept}
            keys = [(c.key, c.label) for c in cons]
            print(f"\n## PostgreSQL {version} -> {version}\n")
            print("\n".join(table(describe, iowait.txns(ctx), rounds, keys)))
            sys.stdout.flush()
    if args.json_out:
        args.json_out.write_text(json.dumps({"args": vars(args), "results": results},
                                            indent=1, default=str))  # fmt: skip
    log("done")


if __name__ == "__main__":
    main()
