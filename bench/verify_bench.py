"""Bench: ``applier verify`` vs a hand-written whole-table hash vs ``pgcopydb compare data``.

The bootstrap bench's table (``bench/bootstrap_bench.py``: bigint key, int,
two texts, a timestamptz; 20M rows ~ 2.3 GB) loaded alike into a throwaway
PG15 source and a PG15 (or 18) target, then compared three ways, each timed
from the command's start to its answer:

* applier: ``applier verify --json`` as a subprocess (all of its start-up
  included), ``local[*]`` (which runs the ranges on the driver's threads and
  starts no Spark), the default ``[verify]`` settings;
* handwritten: ``SELECT count(*), md5(string_agg(md5(b::text), '' ORDER BY id))``
  on each side, the two queries at once (two threads);
* pgcopydb: ``pgcopydb compare data`` (one ``sum(hashtext(row::text))`` query
  per table and side), when a pgcopydb with ``compare`` is found
  (``--pgcopydb PATH``; Debian 12's 0.10 has no ``compare``).

First the fixed start-up: ``applier verify`` of a one-row table (``tiny``)
and pgcopydb on a database holding only that table; then equal tables, then
after 100 scattered differences on the target (34 rows changed, 33 deleted,
33 extra). Only applier names the rows; the other two only say "differs".
``--runs N`` interleaves the methods N times and reports medians (the
machine is shared and noisy).

Usage: ``python bench/verify_bench.py --rows 5000000 [--runs 3] [--target-version 18]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from applier.localpg import local_cluster, make_base_dir

sys.path.insert(0, str(Path(__file__).parent))
from bootstrap_bench import TABLE  # the same table as the bootstrap bench

DIFFS = 100


def load(cluster: Any, rows: int) -> None:
    """The bootstrap bench's rows (deterministic: both sides get the same)."""
    cluster.execute(TABLE)
    step = 1_000_000
    for lo in range(0, rows, step):
        hi = min(lo + step, rows)
        cluster.execute(
            "INSERT INTO bench SELECT g, g % 1000, 'name ' || g,"
            " md5(g::text) || md5((g+1)::text),"
            " '2024-01-01'::timestamptz + g * interval '1 s'"
            f" FROM generate_series({lo + 1}, {hi}) g"
        )
    cluster.execute("VACUUM ANALYZE bench")


def scatter_differences(sub: Any, rows: int) -> set[int]:
    """100 differences spread over the whole key range; returns their keys."""
    step = rows // 67
    changed = [1 + i * step for i in range(34)]
    deleted = [1 + (34 + i) * step for i in range(33)]
    extra = [rows + 1000 + i for i in range(33)]
    sub.execute(
        f"UPDATE bench SET name = name || '!' WHERE id IN ({','.join(map(str, changed))});"
        f"DELETE FROM bench WHERE id IN ({','.join(map(str, deleted))});"
        f"INSERT INTO bench SELECT g, 0, 'extra', 'x', now() FROM unnest("
        f"ARRAY[{','.join(map(str, extra))}]::bigint[]) g"
    )
    sub.execute("VACUUM ANALYZE bench")
    return {*changed, *deleted, *extra}


def bench_applier(cfg: Path, *extra: str) -> tuple[float, bool, set[int]]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "verify", "--config", str(cfg), "--json", *extra],
        capture_output=True,
        text=True,
    )
    dt = time.monotonic() - t0
    if proc.returncode not in (0, 1):
        sys.exit(f"applier verify failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)
    keys = {d["key"]["id"] for t in report["tables"] for d in t["differences"]}
    return dt, bool(report["equal"]), keys


HANDWRITTEN = "SELECT count(*), md5(string_agg(md5(b::text), '' ORDER BY id)) FROM bench b"


def bench_handwritten(pub: Any, sub: Any, db: str, tiny: bool = False) -> tuple[float, bool]:
    out: dict[str, Any] = {}
    query = HANDWRITTEN.replace("bench b", "tiny b") if tiny else HANDWRITTEN

    def one(name: str, cluster: Any) -> None:
        out[name] = cluster.execute(query, db)[0]

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=a) for a in (("s", pub), ("t", sub))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0, out["s"] == out["t"]


def pgcopydb_with_compare(path: str | None) -> str | None:
    exe = path or shutil.which("pgcopydb")
    if not exe:
        return None
    proc = subprocess.run([exe, "compare", "--help"], capture_output=True, text=True)
    return exe if "data" in proc.stdout + proc.stderr and "unknown" not in proc.stderr else None


def bench_pgcopydb(exe: str, pub: Any, sub: Any, db: str) -> tuple[float, bool]:
    work = tempfile.mkdtemp(prefix="pgcopydb-bench-")
    try:
        t0 = time.monotonic()
        proc = subprocess.run(
            [exe, "compare", "data", "--source", _uri(pub, db), "--target", _uri(sub, db),
             "--dir", work, "--notice"],
            capture_output=True, text=True,
        )  # fmt: skip
        dt = time.monotonic() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        sys.exit(f"pgcopydb compare data failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    # 0.18 exits 0 either way; a differing table is an ERROR line ("has checksum").
    return dt, "ERROR" not in proc.stderr


def _uri(cluster: Any, db: str) -> str:
    return f"postgres://postgres@127.0.0.1:{cluster.port}/{db}"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--target-version", type=int, default=15, choices=[15, 18])
    ap.add_argument("--runs", type=int, default=3, help="interleaved repetitions (medians)")
    ap.add_argument("--pgcopydb", default=None, help="a pgcopydb with `compare` (0.13+)")
    ap.add_argument("--spark-master", default="local[*]")
    ap.add_argument("--parallelism", type=int, default=None, help="[verify] parallelism")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    base = make_base_dir("applier-vbench-")
    try:
        run_all(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_all(args: argparse.Namespace, base: Path) -> None:
    settings = {"shared_buffers": "'512MB'", "max_wal_size": "'8GB'"}
    db = "bench"
    pgcopydb = pgcopydb_with_compare(args.pgcopydb)
    if pgcopydb is None:
        print("pgcopydb with `compare data` not found: that column is left out", flush=True)
    with (
        local_cluster(15, base, name="pub", settings=settings) as pub,
        local_cluster(args.target_version, base, name="sub", settings=settings) as sub,
    ):
        t0 = time.monotonic()
        for c in (pub, sub):
            c.create_database(db)
            load(_On(c, db), args.rows)
        for c in (pub, sub):  # the start-up phase compares a one-row table
            c.create_database("tiny")
            c.execute("CREATE TABLE tiny (id int PRIMARY KEY); INSERT INTO tiny VALUES (1)", "tiny")
            c.execute("CREATE TABLE tiny (id int PRIMARY KEY); INSERT INTO tiny VALUES (1)", db)
        pub.execute("CREATE PUBLICATION pub FOR TABLE bench, tiny", db)
        print(f"loaded {args.rows:,} rows on both sides in {time.monotonic() - t0:.0f}s")
        cfg = base / "verify.toml"
        cfg.write_text(
            f'[source]\ndsn = "{pub.dsn(db)}"\npublications = ["pub"]\nslot = "vbench"\n'
            f'[target]\ndsn = "{sub.dsn(db)}"\n'
            f'[bootstrap]\nspark_master = "{args.spark_master}"\n'
            '[logging]\nlevel = "warning"\n'
            + (f"[verify]\nparallelism = {args.parallelism}\n" if args.parallelism else "")
        )
        results: dict[str, dict[str, list[float]]] = {}
        loads: list[float] = []
        for phase in ("start-up", "equal", "100 differences"):
            if phase == "100 differences":
                expected = scatter_differences(_On(sub, db), args.rows)
            times: dict[str, list[float]] = {"applier": [], "handwritten": []}
            if pgcopydb:
                times["pgcopydb"] = []
            for i in range(args.runs):
                for name in times:
                    for c in (pub, sub):
                        c.execute("CHECKPOINT")
                    if name == "applier" and phase == "start-up":
                        dt, equal, keys = bench_applier(cfg, "--tables", "public.tiny")
                    elif name == "applier":
                        dt, equal, keys = bench_applier(cfg, "--tables", "public.bench")
                        if phase == "equal":
                            assert equal and not keys, keys
                        else:
                            assert keys == expected, (len(keys), sorted(keys ^ expected)[:10])
                    elif name == "handwritten":
                        dt, equal = bench_handwritten(pub, sub, db, phase == "start-up")
                    else:
                        assert pgcopydb is not None
                        on = "tiny" if phase == "start-up" else db
                        dt, equal = bench_pgcopydb(pgcopydb, pub, sub, on)
                    assert equal == (phase != "100 differences"), (name, phase)
                    times[name].append(dt)
                    load1 = os.getloadavg()[0]  # shared machine: each run's load beside it
                    loads.append(load1)
                    print(f"{phase}: run {i}: {name:12s} {dt:7.1f} s  load {load1:.1f}", flush=True)
            results[phase] = times
    print()
    print(f"load average (1 min) at the runs' ends: {min(loads):.1f}-{max(loads):.1f}")
    print("| phase | method | median s | runs | applier / method |")
    print("| --- | --- | --- | --- | --- |")
    for phase, times in results.items():
        med = {n: statistics.median(v) for n, v in times.items()}
        for name, v in times.items():
            ratio = med["applier"] / med[name]
            runs = ", ".join(f"{x:.1f}" for x in v)
            print(f"| {phase} | {name} | {med[name]:.1f} | {runs} | {ratio:.2f} |")
    print()
    fixed = {n: statistics.median(v) for n, v in results["start-up"].items()}
    for phase in ("equal", "100 differences"):
        for name, v in results[phase].items():
            per_row = (statistics.median(v) - fixed[name]) / args.rows * 1e6
            print(f"{phase}: {name}: start-up {fixed[name]:.1f} s + {per_row:.2f} us a row")


class _On:
    """A cluster seen through one database (``execute`` with that database)."""

    def __init__(self, cluster: Any, db: str) -> None:
        self._c, self._db = cluster, db

    def execute(self, q: str) -> list[tuple[Any, ...]]:
        return list(self._c.execute(q, self._db))


if __name__ == "__main__":
    main()
