"""What conflict policies cost: the same drain by `applier run`, with and without conflicts.

    .venv/bin/python bench/conflict_bench.py [--rows 200000] [--batch 100]
        [--txns 20000] [--per-txn 5] [--repeat 3] [--workloads insert,update] [--no-c]

Two throwaway PostgreSQL 15 clusters, as in ``apply_bench.py`` (whose helpers
this reuses). Per repetition and workload, one slot per variant is created
*before* the workload, so every variant drains the very same backlog, timed
from the process start until a marker row committed after the workload is on
the target. The variants run in turn (A B C A B C ...):

* A: no ``[conflicts]`` section; the target starts without conflicts (empty
  for ``insert``, a copy of the source's rows for ``update``).
* B: ``[conflicts] default = { insert_exists = "skip", update_missing = "skip",
  delete_missing = "skip" }`` and 1% of the changed rows conflicting: for
  ``insert`` the keys divisible by 100 already exist on the target (with
  v = 'local', which must survive); for ``update`` the rows with keys divisible
  by 100 are missing on the target.
* C: A's target (no conflicts) with B's config: the cost of the checked
  statements without the cost of recording.

Workloads: ``insert`` - --rows rows in transactions of --batch rows; ``update``
- --txns transactions of --per-txn UPDATEs by primary key, each row updated
exactly once (keys in a fixed permuted order, so a missing row is one
conflict).

After each drain the target is checked (row counts, rows kept, and exactly the
expected number of rows in ``applier.conflict_log``), so each figure is of a
correct run. Prints the medians and B/A, C/A per workload.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from apply_bench import DB, ROOT, proc_cpu, sh, walsender_cpu

from applier.localpg import LocalCluster, local_cluster

POLICIES = (
    '[conflicts]\ndefault = { insert_exists = "skip", update_missing = "skip", '
    'delete_missing = "skip" }\n'
)
VARIANTS = {"A": "no conflicts", "B": "skip, 1% conflicts", "C": "skip, no conflicts"}


def step(n: int) -> int:
    """A stride coprime with n: the update workload visits every key once, scattered."""
    p = 7919
    while math.gcd(p, n) != 1:
        p += 2
    return p


def setup(pub: LocalCluster, sub: LocalCluster, workload: str, args: argparse.Namespace) -> None:
    for c in (pub, sub):
        sh(c, "DROP TABLE IF EXISTS big, acc, marker")
        sh(c, "CREATE TABLE marker (id int PRIMARY KEY)")
        if workload == "insert":
            sh(c, "CREATE TABLE big (id int PRIMARY KEY, v text, n numeric, t timestamptz)")
        else:
            sh(c, "CREATE TABLE acc (id int PRIMARY KEY, v int NOT NULL, pad text)")
    if workload == "update":
        sh(pub, f"INSERT INTO acc SELECT g, 0, md5(g::text) "
                f"FROM generate_series(1, {n_acc(args)}) g")  # fmt: skip
        sh(pub, "VACUUM ANALYZE acc")
    sh(pub, "DROP PUBLICATION IF EXISTS pub; CREATE PUBLICATION pub FOR ALL TABLES")


def n_acc(args: argparse.Namespace) -> int:
    return int(args.txns * args.per_txn)


def run_workload(pub: LocalCluster, workload: str, args: argparse.Namespace) -> None:
    """Many small source transactions (a DO block that commits in its loop)."""
    if workload == "insert":
        b = args.batch
        sh(pub, f"DO $$ BEGIN FOR i IN 0..{args.rows // b - 1} LOOP "
                f"INSERT INTO big SELECT g, md5(g::text), g / 7.0, now() "
                f"FROM generate_series(i * {b} + 1, (i + 1) * {b}) g; "
                f"COMMIT; END LOOP; END $$")  # fmt: skip
    else:
        n, k = n_acc(args), args.per_txn
        sh(pub, f"DO $$ BEGIN FOR i IN 0..{args.txns - 1} LOOP "
                f"FOR j IN 0..{k - 1} LOOP "
                f"UPDATE acc SET v = v + 1 "
                f"WHERE id = ((i * {k} + j)::bigint * {step(n)}) % {n} + 1; "
                f"END LOOP; COMMIT; END LOOP; END $$")  # fmt: skip


def prepare_target(sub: LocalCluster, workload: str, args: argparse.Namespace, v: str) -> int:
    """Set the target up for variant v; return the number of conflicts it will meet."""
    sh(sub, "TRUNCATE marker")
    if sh(sub, "SELECT to_regclass('applier.conflict_log')")[0][0]:
        sh(sub, "TRUNCATE applier.conflict_log")
    conflicts = 0
    if workload == "insert":
        sh(sub, "TRUNCATE big")
        if v == "B":
            sh(sub, f"INSERT INTO big SELECT g, 'local', 0, now() "
                    f"FROM generate_series(100, {args.rows}, 100) g")  # fmt: skip
            conflicts = args.rows // 100
        sh(sub, "VACUUM ANALYZE big")
    else:
        sh(sub, f"TRUNCATE acc; INSERT INTO acc SELECT g, 0, md5(g::text) "
                f"FROM generate_series(1, {n_acc(args)}) g")  # fmt: skip
        if v == "B":
            conflicts = len(sh(sub, "DELETE FROM acc WHERE id % 100 = 0 RETURNING 1"))
        sh(sub, "VACUUM ANALYZE acc")
    sh(sub, "CHECKPOINT")
    return conflicts


def verify(sub: LocalCluster, workload: str, args: argparse.Namespace, conflicts: int) -> None:
    """The target holds what the drain must leave; raise SystemExit if not."""
    logged = sh(sub, "SELECT conflict, resolution, count(*) FROM applier.conflict_log "
                     "GROUP BY 1, 2")  # fmt: skip
    kind = "insert_exists" if workload == "insert" else "update_missing"
    want = [(kind, "skip", conflicts)] if conflicts else []
    if logged != want:
        raise SystemExit(f"{workload}: conflict_log holds {logged}, expected {want}")
    if workload == "insert":
        got = sh(sub, "SELECT count(*), count(*) FILTER (WHERE v = 'local') FROM big")[0]
        if got != (args.rows, conflicts):
            raise SystemExit(f"insert: target has (rows, local rows) {got}, "
                             f"expected {(args.rows, conflicts)}")  # fmt: skip
    else:
        got = sh(sub, "SELECT count(*), count(*) FILTER (WHERE v <> 1) FROM acc")[0]
        if got != (n_acc(args) - conflicts, 0):
            raise SystemExit(f"update: target has (rows, rows not updated once) {got}, "
                             f"expected {(n_acc(args) - conflicts, 0)}")  # fmt: skip


def wait_marker(sub: LocalCluster, proc: subprocess.Popen[bytes], log: Path) -> None:
    """apply_bench.wait_marker, but give up when the applier exits."""
    while True:
        if sh(sub, "SELECT 1 FROM marker WHERE id = 1"):
            return
        if proc.poll() is not None:
            raise SystemExit(f"applier exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def time_applier(
    pub: LocalCluster, sub: LocalCluster, slot: str, workdir: Path, conflicts: str,
    server_options: str = "",
) -> dict[str, float]:  # fmt: skip
    """apply_bench.time_applier with a [conflicts] section and an exit check.

    ``server_options``: settings for the applier's target sessions (libpq ``options``,
    e.g. ``-c plan_cache_mode=force_custom_plan``), to try a remedy without code."""
    target_options = f" options='{server_options}'" if server_options else ""
    prof = os.environ.get("CONFLICT_BENCH_PROFILE")  # a directory: cProfile each run there
    profile = ["-m", "cProfile", "-o", f"{prof}/{slot}.prof"] if prof else []
    cfg = workdir / f"{slot}.toml"
    cfg.write_text(
        f'[source]\ndsn = "{pub.dsn(DB)}"\npublications = ["pub"]\nslot = "{slot}"\n'
        f'[target]\ndsn = "{sub.dsn(DB)}{target_options}"\norigin = "o_{slot}"\n'
        '[apply]\nsynchronous_commit = "off"\n[logging]\nlevel = "info"\nformat = "json"\n'
        + conflicts
    )
    subprocess.run(
        [sys.executable, "-m", "applier.cli", "migrate", "--config", str(cfg)],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    log = workdir / f"{slot}.log"
    t0, wall0 = time.monotonic(), time.time()
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, *profile, "-m", "applier.cli", "run", "--config", str(cfg)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    wait_marker(sub, proc, log)
    out = {"wall": time.monotonic() - t0}
    backend = sh(sub, "SELECT pid FROM pg_stat_activity WHERE application_name = 'applier apply'")
    out["cpu target backend"] = proc_cpu(backend[0][0] if backend else None)
    out["cpu walsender"] = walsender_cpu(pub, slot)
    proc.terminate()
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    out["cpu applier process"] = usage.ru_utime + usage.ru_stime
    for line in log.read_text().splitlines():
        if line.startswith("{") and json.loads(line)["msg"] == "replication started":
            out["start-up"] = datetime.fromisoformat(json.loads(line)["ts"]).timestamp() - wall0
            out["streaming"] = out["wall"] - out["start-up"]
            break
    return out


def bench(
    pub: LocalCluster, sub: LocalCluster, workload: str, args: argparse.Namespace,
    workdir: Path, rnd: int,
) -> dict[str, dict[str, float]]:  # fmt: skip
    setup(pub, sub, workload, args)
    variants = list(args.variants)
    for v in variants:
        sh(pub, f"SELECT pg_create_logical_replication_slot('{v.lower()}_{workload}_{rnd}', "
                f"'pgoutput')")  # fmt: skip
    run_workload(pub, workload, args)
    sh(pub, "INSERT INTO marker VALUES (1)")
    out: dict[str, dict[str, float]] = {}
    for v in variants:
        slot = f"{v.lower()}_{workload}_{rnd}"
        conflicts = prepare_target(sub, workload, args, v)
        out[v] = time_applier(
            pub, sub, slot, workdir, "" if v == "A" else POLICIES, args.target_options
        )
        verify(sub, workload, args, conflicts)
        sh(pub, f"SELECT pg_drop_replication_slot('{slot}')")
        print(f"  {workload} run {rnd + 1} {v}: {out[v]['wall']:.2f} s", flush=True)
    return out


def report(
    workload: str, args: argparse.Namespace, runs: list[dict[str, dict[str, float]]]
) -> None:
    size = (f"{args.rows} rows in txns of {args.batch}" if workload == "insert"
            else f"{args.txns} txns of {args.per_txn} updates")  # fmt: skip
    print(f"{workload} ({size}, median of {len(runs)}):")
    for r in runs:  # the CPU of the three processes: less noisy than wall time here
        for m in r.values():
            m["cpu total"] = sum(x for k, x in m.items() if k.startswith("cpu "))
    med = {
        v: {k: statistics.median(r[v][k] for r in runs if k in r[v]) for k in runs[0][v]}
        for v in runs[0]
    }
    for v, m in med.items():
        cpu = ", ".join(f"{k[4:]} {x:.2f}" for k, x in m.items() if k.startswith("cpu "))
        streaming = m.get("streaming", float("nan"))
        print(f"  {v} {VARIANTS[v]:20s} {m['wall']:6.2f} s (streaming {streaming:.2f} s;"
              f" CPU s: {cpu})")  # fmt: skip
    for v in med:
        if v == "A":
            continue
        for k, what in (("wall", "wall"), ("cpu total", "CPU")):
            per_run = ", ".join(f"{r[v][k] / r['A'][k]:.2f}" for r in runs)
            print(f"  {v}/A {what:4s} {med[v][k] / med['A'][k]:.2f} "
                  f"(of the medians; per run {per_run})")  # fmt: skip
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--txns", type=int, default=20_000)
    ap.add_argument("--per-txn", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workloads", default="insert,update")
    ap.add_argument("--no-c", dest="variants", action="store_const", const="AB", default="ABC")
    ap.add_argument(
        "--target-options",
        default="",
        help="libpq options of the applier's "
        "target sessions, for every variant (e.g. '-c enable_seqscan=off')",
    )
    args = ap.parse_args()
    if args.rows % args.batch:
        ap.error("--rows must be a multiple of --batch")
    settings = {"logical_decoding_work_mem": "64MB", "max_wal_size": "4GB"}
    with tempfile.TemporaryDirectory() as tmp, local_cluster(15, settings=settings) as pub, \
            local_cluster(15, name="sub", settings=settings) as sub:  # fmt: skip
        pub.create_database(DB)
        sub.create_database(DB)
        for workload in args.workloads.split(","):
            runs = [bench(pub, sub, workload, args, Path(tmp), i) for i in range(args.repeat)]
            report(workload, args, runs)


if __name__ == "__main__":
    main()
