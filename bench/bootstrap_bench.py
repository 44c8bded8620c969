"""Bench: ``applier bootstrap`` vs PostgreSQL's built-in table sync vs hand-run COPY pipes.

One table of ``--rows`` rows (20M ~ 2.3 GB by default) on a throwaway PG15
publisher, copied into fresh databases of a throwaway subscriber (PG15 or
PG18) three ways, each timed from start to a usable table with its primary
key:

* applier: ``applier bootstrap`` as a subprocess (Spark start-up included);
* builtin: CREATE SUBSCRIPTION ... WITH (copy_data = true) into a pre-created
  table with its primary key, until ``srsubstate = 'r'``;
* pipes: two ``COPY (SELECT ... WHERE ctid half) TO STDOUT | COPY ... FROM
  STDIN`` psql pipes in parallel, then ALTER TABLE ... ADD PRIMARY KEY.

Usage: ``python bench/bootstrap_bench.py --rows 2000000 [--target-version 18] [--runs 3]``

``--runs N`` repeats the three methods N times, interleaved (each run into a
fresh database), and reports medians: the machine is shared and noisy. The
applier's own log gives its phases (Spark start-up, copy, post-data).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from applier.localpg import bin_dir, local_cluster, make_base_dir

TABLE = "CREATE TABLE bench (id bigint PRIMARY KEY, k int, name text, pad text, ts timestamptz)"
TABLE_NOPK = "CREATE TABLE bench (id bigint NOT NULL, k int, name text, pad text, ts timestamptz)"


def load(pub, rows: int) -> None:  # type: ignore[no-untyped-def]
    pub.execute(TABLE)
    step = 1_000_000
    for lo in range(0, rows, step):
        hi = min(lo + step, rows)
        pub.execute(
            "INSERT INTO bench SELECT g, g % 1000, 'name ' || g,"
            " md5(g::text) || md5((g+1)::text),"
            " '2024-01-01'::timestamptz + g * interval '1 s'"
            f" FROM generate_series({lo + 1}, {hi}) g"
        )
    pub.execute("VACUUM ANALYZE bench")
    pub.execute("CREATE PUBLICATION pub FOR TABLE bench")


def bench_applier(pub, sub, db: str, workdir: Path, slice_size: str, master: str) -> float:  # type: ignore[no-untyped-def]
    sub.create_database(db)
    cfg = workdir / "bench.toml"
    cfg.write_text(
        f'[source]\ndsn = "{pub.dsn()}"\npublications = ["pub"]\nslot = "bench_applier"\n'
        f'[target]\ndsn = "{sub.dsn(db)}"\n'
        f'[bootstrap]\nslice_size = "{slice_size}"\nspark_master = "{master}"\n'
        '[logging]\nlevel = "info"\nformat = "json"\n'
    )
    t0 = time.monotonic()
    wall0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "bootstrap", "--config", str(cfg), "--quiet"],
        capture_output=True,
        text=True,
    )
    dt = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"applier bootstrap failed:\n{proc.stderr[-3000:]}")
    phases = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("{"):
            continue
        rec = json.loads(line)
        if rec["msg"] in ("spark started", "copy done", "post-data done"):
            phases[rec["msg"]] = rec.get("seconds")
        if rec["msg"] == "spark started":
            ts = datetime.fromisoformat(rec["ts"]).timestamp()  # ISO 8601
            phases["before spark"] = round(ts - wall0 - rec["seconds"], 1)
            phases["class archive"] = rec.get("class_archive")  # `applier spark-archive`
    slices = sub.execute(
        "SELECT count(*), round(sum(seconds)::numeric, 1), round(max(seconds)::numeric, 1) "
        "FROM applier.bootstrap_slice",
        db,
    )[0]
    phases["slices (n, sum s, max s)"] = tuple(float(x) for x in slices)
    print(f"  applier phases: {phases}", flush=True)
    pub.execute("SELECT pg_drop_replication_slot('bench_applier')")
    return dt


def bench_builtin(pub, sub, db: str) -> float:  # type: ignore[no-untyped-def]
    sub.create_database(db)
    sub.execute(TABLE, db)
    t0 = time.monotonic()
    sub.execute(
        f"CREATE SUBSCRIPTION s CONNECTION '{pub.dsn()}' PUBLICATION pub WITH (copy_data = true)",
        db,
    )
    while sub.execute("SELECT bool_and(srsubstate = 'r') FROM pg_subscription_rel", db) != [
        (True,)
    ]:
        time.sleep(0.2)
    dt = time.monotonic() - t0
    sub.execute("DROP SUBSCRIPTION s", db)
    return dt


def bench_pipes(pub, sub, db: str) -> float:  # type: ignore[no-untyped-def]
    sub.create_database(db)
    psql = str(bin_dir(18) / "psql")
    pages = int(pub.execute("SELECT pg_relation_size('bench') / 8192")[0][0])
    half = pages // 2
    t0 = time.monotonic()
    sub.execute(TABLE_NOPK, db)
    procs = []
    for cond in (f"ctid < '({half},0)'", f"ctid >= '({half},0)'"):
        out = f"COPY (SELECT * FROM bench WHERE {cond}) TO STDOUT"
        cmd = (
            f'{psql} -X -q "{pub.dsn()}" -c "{out}" | '
            f'{psql} -X -q "{sub.dsn(db)}" -c "COPY bench FROM STDIN"'
        )
        procs.append(subprocess.Popen(cmd, shell=True))  # bench: fixed text, our own DSNs
    for p in procs:
        assert p.wait() == 0
    sub.execute("ALTER TABLE bench ADD PRIMARY KEY (id)", db)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--target-version", type=int, default=15, choices=[15, 18])
    ap.add_argument("--slice-size", default="256MB")  # the config default
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument("--runs", type=int, default=1, help="interleaved repetitions (medians)")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    base = make_base_dir("applier-bench-")
    try:
        run_all(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)  # the servers' logs and the config


def run_all(args: argparse.Namespace, base: Path) -> None:
    settings = {
        "shared_buffers": "'512MB'",
        "max_wal_size": "'8GB'",
        "checkpoint_timeout": "'30min'",
    }
    with (
        local_cluster(15, base, name="pub", settings=settings) as pub,
        local_cluster(args.target_version, base, name="sub", settings=settings) as sub,
    ):
        t0 = time.monotonic()
        load(pub, args.rows)
        size = pub.execute("SELECT pg_size_pretty(pg_total_relation_size('bench'))")[0][0]
        print(f"loaded {args.rows:,} rows ({size}) in {time.monotonic() - t0:.0f}s", flush=True)
        times: dict[str, list[float]] = {"pipes": [], "applier": [], "builtin": []}
        for i in range(args.runs):
            db = {name: f"{name[0]}{i}" for name in times}
            for name in times:
                sub.execute("CHECKPOINT")
                if name == "pipes":
                    dt = bench_pipes(pub, sub, db[name])
                elif name == "applier":
                    dt = bench_applier(pub, sub, db[name], base, args.slice_size, args.spark_master)
                else:
                    dt = bench_builtin(pub, sub, db[name])
                n = sub.execute("SELECT count(*) FROM bench", db[name])[0][0]
                assert n == args.rows, (name, n)
                sub.drop_database(db[name])
                times[name].append(dt)
                print(f"run {i}: {name:8s} {dt:8.1f} s", flush=True)
    med = {name: statistics.median(v) for name, v in times.items()}
    for name, v in times.items():
        print(f"{name:8s} {med[name]:8.1f} s  (median of {[round(x, 1) for x in v]})")
    print(f"applier/builtin = {med['applier'] / med['builtin']:.2f}x (goal <= 0.7x)")
    print(f"applier/pipes   = {med['applier'] / med['pipes']:.2f}x (goal <= 1.3x)")


if __name__ == "__main__":
    main()
