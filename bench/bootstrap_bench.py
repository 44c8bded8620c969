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

Usage: ``python bench/bootstrap_bench.py --rows 2000000 [--target-version 18]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
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


def bench_applier(pub, sub, workdir: Path, slice_size: str, master: str) -> float:  # type: ignore[no-untyped-def]
    sub.create_database("a")
    cfg = workdir / "bench.toml"
    cfg.write_text(
        f'[source]\ndsn = "{pub.dsn()}"\npublications = ["pub"]\nslot = "bench_applier"\n'
        f'[target]\ndsn = "{sub.dsn("a")}"\n'
        f'[bootstrap]\nslice_size = "{slice_size}"\nspark_master = "{master}"\n'
        '[logging]\nlevel = "warning"\n'
    )
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "applier.cli", "bootstrap", "--config", str(cfg), "--quiet"],
        check=True,
    )
    dt = time.monotonic() - t0
    pub.execute("SELECT pg_drop_replication_slot('bench_applier')")
    return dt


def bench_builtin(pub, sub) -> float:  # type: ignore[no-untyped-def]
    sub.create_database("b")
    sub.execute(TABLE, "b")
    t0 = time.monotonic()
    sub.execute(
        f"CREATE SUBSCRIPTION s CONNECTION '{pub.dsn()}' PUBLICATION pub WITH (copy_data = true)",
        "b",
    )
    while sub.execute("SELECT bool_and(srsubstate = 'r') FROM pg_subscription_rel", "b") != [
        (True,)
    ]:
        time.sleep(0.2)
    dt = time.monotonic() - t0
    sub.execute("DROP SUBSCRIPTION s", "b")
    return dt


def bench_pipes(pub, sub) -> float:  # type: ignore[no-untyped-def]
    sub.create_database("c")
    psql = str(bin_dir(18) / "psql")
    pages = int(pub.execute("SELECT pg_relation_size('bench') / 8192")[0][0])
    half = pages // 2
    t0 = time.monotonic()
    sub.execute(TABLE_NOPK, "c")
    procs = []
    for cond in (f"ctid < '({half},0)'", f"ctid >= '({half},0)'"):
        out = f"COPY (SELECT * FROM bench WHERE {cond}) TO STDOUT"
        cmd = (
            f'{psql} -X -q "{pub.dsn()}" -c "{out}" | '
            f'{psql} -X -q "{sub.dsn("c")}" -c "COPY bench FROM STDIN"'
        )
        procs.append(subprocess.Popen(cmd, shell=True))  # bench: fixed text, our own DSNs
    for p in procs:
        assert p.wait() == 0
    sub.execute("ALTER TABLE bench ADD PRIMARY KEY (id)", "c")
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--target-version", type=int, default=15, choices=[15, 18])
    ap.add_argument("--slice-size", default="64MB")
    ap.add_argument("--spark-master", default="local[2]")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    base = make_base_dir("applier-bench-")
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
        results = {
            "pipes": bench_pipes(pub, sub),
            "applier": bench_applier(pub, sub, base, args.slice_size, args.spark_master),
            "builtin": bench_builtin(pub, sub),
        }
        counts = {db: sub.execute("SELECT count(*) FROM bench", db)[0][0] for db in "abc"}
        assert set(counts.values()) == {args.rows}, counts
    for name, secs in results.items():
        print(f"{name:8s} {secs:8.1f} s")
    print(f"applier/builtin = {results['applier'] / results['builtin']:.2f}x (goal <= 0.7x)")
    print(f"applier/pipes   = {results['applier'] / results['pipes']:.2f}x (goal <= 1.3x)")


if __name__ == "__main__":
    main()
