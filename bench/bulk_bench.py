"""Bulk DELETEs and REPLICA IDENTITY FULL without an index: applier trees side by side.

    .venv/bin/python bench/bulk_bench.py [--delete-rows 1000000] [--full-rows 20000]
        [--full-updates 5000] [--repeat 3] [--before /path/to/other/tree] [--workloads ...]

Two throwaway PostgreSQL 15 clusters. For each workload one slot per consumer
is created before the workload runs, so every consumer drains the very same
backlog; the target table is put back to its starting rows before each one.
Consumers: the built-in subscriber (PostgreSQL 15's default: not streamed),
``applier run`` from this tree, and with ``--before`` from another checkout
(e.g. a ``git worktree`` of the commit before), run interleaved per repeat.

Workloads (issue 16): ``delete`` - one transaction deleting --delete-rows rows
of a keyed table (workload 4); ``full`` - --full-updates single-row UPDATEs,
each its own transaction, of a REPLICA IDENTITY FULL table of --full-rows rows
with no index on the target (workload 5, reduced: one scan per change is
quadratic). Prints medians and the ratios.

Measured on the shared 2-core machine (other jobs running; PostgreSQL 15 -> 15),
``--before`` a worktree of the commit before bulk DELETEs and FULL batches:

=====================================================  ========  ===============  =======
workload                                               built-in  applier before   applier
=====================================================  ========  ===============  =======
delete 1,000,000 rows, one transaction (1 run)          15.0 s    37.6 s           27.6 s
delete 200,000 rows, one transaction (1 run)             2.7 s    13.9 s           10.0 s
5,000 FULL UPDATEs of 20,000 rows (median of 3)         11.1 s    15.0 s            4.1 s
=====================================================  ========  ===============  =======

What remains of the DELETE time is Python per change (decoding, dispatch, holding:
a cProfile of 200,000 DELETEs spends ~2 s of 16 s in the 782 bulk statements' sending).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from applier.localpg import LocalCluster, local_cluster  # noqa: E402

DB = "bench"


def sh(cluster: LocalCluster, sql: str) -> list[tuple[Any, ...]]:
    return cluster.execute(sql, DB)


def wait_marker(sub: LocalCluster, marker: int, timeout: float = 7200) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sh(sub, f"SELECT 1 FROM marker WHERE id = {marker}"):
            return
        time.sleep(0.05)
    raise SystemExit("timed out waiting for the marker")


def fill(c: LocalCluster, workload: str, args: argparse.Namespace) -> None:
    """The table's starting rows."""
    if workload == "delete":
        sh(c, f"INSERT INTO d SELECT g, md5(g::text) FROM generate_series(1, {args.delete_rows}) g")
    else:
        sh(
            c,
            f"INSERT INTO f SELECT g, md5(g::text), g FROM generate_series(1, {args.full_rows}) g",
        )
    sh(c, "VACUUM ANALYZE")


def setup(pub: LocalCluster, sub: LocalCluster, workload: str, args: argparse.Namespace) -> None:
    for c in (pub, sub):
        sh(c, "DROP TABLE IF EXISTS d, f, marker")
        sh(c, "CREATE TABLE marker (id int PRIMARY KEY)")
        if workload == "delete":
            sh(c, "CREATE TABLE d (id int PRIMARY KEY, v text)")
        else:
            sh(c, "CREATE TABLE f (a int, b text, c int)")  # no index on either side
            sh(c, "ALTER TABLE f REPLICA IDENTITY FULL")
        fill(c, workload, args)
    sh(pub, "DROP PUBLICATION IF EXISTS pub")
    sh(pub, "CREATE PUBLICATION pub FOR ALL TABLES")


def run_workload(pub: LocalCluster, workload: str, args: argparse.Namespace) -> None:
    if workload == "delete":
        sh(pub, "DELETE FROM d")
        return
    # Random rows, each UPDATE its own transaction (a procedure commits each).
    sh(pub, f"""
        CREATE OR REPLACE PROCEDURE bench_full() LANGUAGE plpgsql AS $$
        BEGIN
          FOR i IN 1..{args.full_updates} LOOP
            UPDATE f SET c = c + 1 WHERE a = 1 + (i * 7919) % {args.full_rows};
            COMMIT;
          END LOOP;
        END $$""")  # fmt: skip
    sh(pub, "CALL bench_full()")


def reset_target(sub: LocalCluster, workload: str, args: argparse.Namespace) -> None:
    sh(sub, f"TRUNCATE marker, {'d' if workload == 'delete' else 'f'}")
    fill(sub, workload, args)


def time_builtin(pub: LocalCluster, sub: LocalCluster, slot: str) -> float:
    t0 = time.monotonic()
    sh(sub, f"CREATE SUBSCRIPTION bsub CONNECTION '{pub.dsn(DB)}' PUBLICATION pub "
            f"WITH (copy_data = false, create_slot = false, slot_name = '{slot}')")  # fmt: skip
    wait_marker(sub, 1)
    elapsed = time.monotonic() - t0
    sh(sub, "ALTER SUBSCRIPTION bsub DISABLE")
    sh(sub, "ALTER SUBSCRIPTION bsub SET (slot_name = NONE)")
    sh(sub, "DROP SUBSCRIPTION bsub")
    return elapsed


def time_applier(
    pub: LocalCluster, sub: LocalCluster, slot: str, tree: Path, workdir: Path
) -> float:
    cfg = workdir / f"{slot}.toml"
    cfg.write_text(
        f'[source]\ndsn = "{pub.dsn(DB)}"\npublications = ["pub"]\nslot = "{slot}"\n'
        f'[target]\ndsn = "{sub.dsn(DB)}"\norigin = "o_{slot}"\n'
        '[apply]\nsynchronous_commit = "off"\n[logging]\nlevel = "info"\n'
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    run = [sys.executable, "-m", "applier.cli"]
    subprocess.run(
        [*run, "migrate", "--config", str(cfg)], cwd=tree, env=env, check=True, capture_output=True
    )
    t0 = time.monotonic()
    with open(workdir / f"{slot}.log", "wb") as log:
        proc = subprocess.Popen(
            [*run, "run", "--config", str(cfg)], cwd=tree, env=env,
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        wait_marker(sub, 1)
        elapsed = time.monotonic() - t0
        proc.terminate()
        proc.wait()
    return elapsed


def bench(
    pub: LocalCluster, sub: LocalCluster, workload: str, args: argparse.Namespace,
    trees: dict[str, Path], workdir: Path, rnd: int,
) -> dict[str, float]:  # fmt: skip
    setup(pub, sub, workload, args)
    names = ["built-in", *trees]
    slots = {n: f"s{i}_{workload}_{rnd}" for i, n in enumerate(names)}
    for s in slots.values():
        sh(pub, f"SELECT pg_create_logical_replication_slot('{s}', 'pgoutput')")
    run_workload(pub, workload, args)
    sh(pub, "INSERT INTO marker VALUES (1)")
    out: dict[str, float] = {}
    for n in names:
        reset_target(sub, workload, args)
        if n == "built-in":
            out[n] = time_builtin(pub, sub, slots[n])
        else:
            out[n] = time_applier(pub, sub, slots[n], trees[n], workdir)
        if workload == "full":  # the result must be the source's
            check = "SELECT sum(c)::text, count(*) FROM f"
            assert sh(sub, check) == sh(pub, check), n
        print(f"  {workload} round {rnd}: {n} {out[n]:.2f} s", flush=True)
    for s in slots.values():
        sh(pub, f"SELECT pg_drop_replication_slot('{s}')")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--delete-rows", type=int, default=1_000_000)
    ap.add_argument("--full-rows", type=int, default=20_000)
    ap.add_argument("--full-updates", type=int, default=5_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", type=Path, help="another applier checkout to compare with")
    ap.add_argument("--workloads", default="delete,full")
    args = ap.parse_args()
    trees = {"applier": ROOT}
    if args.before:
        trees = {"applier before": args.before.resolve(), **trees}
    settings = {"logical_decoding_work_mem": "64MB", "max_wal_size": "4GB"}
    with tempfile.TemporaryDirectory() as tmp, local_cluster(15, settings=settings) as pub, \
            local_cluster(15, name="sub", settings=settings) as sub:  # fmt: skip
        pub.create_database(DB)
        sub.create_database(DB)
        for workload in args.workloads.split(","):
            runs = [
                bench(pub, sub, workload, args, trees, Path(tmp), i) for i in range(args.repeat)
            ]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            size = (
                f"{args.delete_rows} rows deleted in one transaction"
                if workload == "delete"
                else f"{args.full_updates} single-row UPDATEs, FULL identity, "
                f"{args.full_rows} rows, no index"
            )
            print(f"{workload} ({size}; median of {args.repeat}):")
            for k, v in med.items():
                print(f"  {k:16s} {v:8.2f} s   /built-in {v / med['built-in']:.2f}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
