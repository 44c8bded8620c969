"""Drain the same slot backlog with pg_recvlogical, the built-in subscriber and `applier run`.

    .venv/bin/python bench/apply_bench.py [--rows 1000000] [--txns 20000] [--repeat 1]

Two throwaway PostgreSQL 15 clusters (publisher, subscriber). For each workload
three slots are created *before* the workload, so each consumer gets the very
same backlog; then the workload runs, followed by a marker transaction, and
each consumer is timed from its start until the marker is on the target (for
pg_recvlogical: until it reaches the marker's LSN, writing to /dev/null).

Workloads: ``insert`` - one transaction inserting --rows rows; ``pgbench`` -
--txns TPC-B transactions (4 clients). Prints the times, the ratios
applier/built-in and applier/pg_recvlogical, and the applier's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from applier.localpg import LocalCluster, local_cluster  # noqa: E402

DB = "bench"


def sh(cluster: LocalCluster, sql: str) -> list[tuple[Any, ...]]:
    return cluster.execute(sql, DB)


def wait_marker(sub: LocalCluster, marker: int, timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if sh(sub, f"SELECT 1 FROM marker WHERE id = {marker}"):
                return
        except Exception:  # the table may be locked by a truncate; retry
            pass
        time.sleep(0.05)
    raise SystemExit("timed out waiting for the marker")


def setup_schema(pub: LocalCluster, sub: LocalCluster, workload: str) -> None:
    for c in (pub, sub):
        sh(c, "DROP TABLE IF EXISTS big, marker, pgbench_accounts, pgbench_branches, "
              "pgbench_tellers, pgbench_history")  # fmt: skip
        sh(c, "CREATE TABLE marker (id int PRIMARY KEY)")
        if workload == "insert":
            sh(c, "CREATE TABLE big (id int PRIMARY KEY, v text, n numeric, t timestamptz)")
    if workload == "pgbench":
        for c, steps in ((pub, "dtgvp"), (sub, "dtp")):
            subprocess.run(
                [pub.bin("pgbench"), "-i", "-q", "-s", "1", "-I", steps, "-h", "127.0.0.1",
                 "-p", str(c.port), "-U", "postgres", DB],
                check=True, capture_output=True,
            )  # fmt: skip
        sh(sub, "TRUNCATE pgbench_accounts, pgbench_branches, pgbench_tellers")
        for t in ("pgbench_branches", "pgbench_tellers", "pgbench_accounts"):
            rows = sh(pub, f"SELECT count(*) FROM {t}")
            assert rows
        # Same starting data on the target.
        with pub.connect(DB) as s, sub.connect(DB) as d:
            for t in ("pgbench_branches", "pgbench_tellers", "pgbench_accounts"):
                with (
                    s.cursor().copy(f"COPY {t} TO STDOUT") as out,
                    d.cursor().copy(f"COPY {t} FROM STDIN") as into,
                ):
                    for chunk in out:
                        into.write(chunk)
    sh(pub, "DROP PUBLICATION IF EXISTS pub; CREATE PUBLICATION pub FOR ALL TABLES")


def reset_target(sub: LocalCluster, workload: str) -> None:
    if workload == "insert":
        sh(sub, "TRUNCATE big, marker")
    else:
        sh(sub, "TRUNCATE marker, pgbench_history")


def run_workload(pub: LocalCluster, workload: str, rows: int, txns: int) -> None:
    if workload == "insert":
        sh(pub, f"INSERT INTO big SELECT g, md5(g::text), g / 7.0, now() "
                f"FROM generate_series(1, {rows}) g")  # fmt: skip
    else:
        clients = 4
        subprocess.run(
            [pub.bin("pgbench"), "-n", "-c", str(clients), "-t", str(txns // clients),
             "-h", "127.0.0.1", "-p", str(pub.port), "-U", "postgres", DB],
            check=True, capture_output=True,
        )  # fmt: skip


def time_recvlogical(pub: LocalCluster, slot: str, end_lsn: str) -> float:
    t0 = time.monotonic()
    subprocess.run(
        [pub.bin("pg_recvlogical"), "-h", "127.0.0.1", "-p", str(pub.port), "-U", "postgres",
         "-d", DB, "-S", slot, "--start", "-E", end_lsn, "-f", "/dev/null",
         "-o", "proto_version=1", "-o", "publication_names=pub", "--no-loop"],
        check=True, capture_output=True,
    )  # fmt: skip
    return time.monotonic() - t0


def proc_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) a server process has used so far."""
    if not pid:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def walsender_cpu(pub: LocalCluster, slot: str) -> float:
    rows = sh(pub, f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{slot}'")
    return proc_cpu(rows[0][0] if rows else None)


def time_builtin(
    pub: LocalCluster, sub: LocalCluster, slot: str, marker: int
) -> tuple[float, dict[str, float]]:
    t0 = time.monotonic()
    sh(sub, f"CREATE SUBSCRIPTION bsub CONNECTION '{pub.dsn(DB)}' PUBLICATION pub "
            f"WITH (copy_data = false, create_slot = false, slot_name = '{slot}', "
            f"streaming = on)")  # fmt: skip
    wait_marker(sub, marker)
    elapsed = time.monotonic() - t0
    worker = sh(sub, "SELECT pid FROM pg_stat_subscription WHERE subname = 'bsub' "
                     "AND relid IS NULL")  # fmt: skip
    cpu = {"apply worker": proc_cpu(worker[0][0] if worker else None),
           "walsender": walsender_cpu(pub, slot)}  # fmt: skip
    sh(sub, "ALTER SUBSCRIPTION bsub DISABLE")
    sh(sub, "ALTER SUBSCRIPTION bsub SET (slot_name = NONE)")
    sh(sub, "DROP SUBSCRIPTION bsub")
    return elapsed, cpu


def time_applier(
    pub: LocalCluster, sub: LocalCluster, slot: str, marker: int, workdir: Path
) -> tuple[float, dict[str, float], int]:
    cfg = workdir / f"{slot}.toml"
    cfg.write_text(
        f'[source]\ndsn = "{pub.dsn(DB)}"\npublications = ["pub"]\nslot = "{slot}"\n'
        f'[target]\ndsn = "{sub.dsn(DB)}"\norigin = "o_{slot}"\n'
        '[apply]\nsynchronous_commit = "off"\n[logging]\nlevel = "info"\nformat = "json"\n'
    )
    # The applier schema on the target is set up once per target (as the
    # built-in subscriber's catalogs exist before CREATE SUBSCRIPTION): not
    # part of draining the backlog.
    subprocess.run(
        [sys.executable, "-m", "applier.cli", "migrate", "--config", str(cfg)],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    t0, wall0 = time.monotonic(), time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "applier.cli", "run", "--config", str(cfg)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(workdir / f"{slot}.log", "wb"),  # noqa: SIM115
    )  # fmt: skip
    wait_marker(sub, marker)
    elapsed = time.monotonic() - t0
    backend = sh(sub, "SELECT pid FROM pg_stat_activity WHERE application_name = 'applier apply'")
    cpu = {"target backend": proc_cpu(backend[0][0] if backend else None),
           "walsender": walsender_cpu(pub, slot)}  # fmt: skip
    proc.terminate()
    # This child's own rusage (RUSAGE_CHILDREN would mix in pgbench and pg_recvlogical).
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    cpu["applier process"] = usage.ru_utime + usage.ru_stime
    # Start-up: process start until START_REPLICATION was sent (the json log's clock).
    for line in (workdir / f"{slot}.log").read_text().splitlines():
        if line.startswith("{") and json.loads(line)["msg"] == "replication started":
            ts = datetime.fromisoformat(json.loads(line)["ts"]).timestamp()  # ISO 8601
            cpu["start-up (wall)"] = ts - wall0
            break
    return elapsed, cpu, usage.ru_maxrss * 1024


def bench(pub: LocalCluster, sub: LocalCluster, workload: str, args: argparse.Namespace,
          workdir: Path, rnd: int) -> dict[str, float]:  # fmt: skip
    setup_schema(pub, sub, workload)
    slots = [f"{k}_{workload}_{rnd}" for k in ("r", "b", "a")]
    for s in slots:
        sh(pub, f"SELECT pg_create_logical_replication_slot('{s}', 'pgoutput')")
    run_workload(pub, workload, args.rows, args.txns)
    marker = 1
    sh(pub, f"INSERT INTO marker VALUES ({marker})")
    end_lsn = str(sh(pub, "SELECT pg_current_wal_lsn()")[0][0])
    out: dict[str, float] = {}
    out["pg_recvlogical"] = time_recvlogical(pub, slots[0], end_lsn)
    reset_target(sub, workload)
    out["builtin"], cpu = time_builtin(pub, sub, slots[1], marker)
    out.update({f"cpu built-in {k}": v for k, v in cpu.items()})
    reset_target(sub, workload)
    out["applier"], cpu, rss = time_applier(pub, sub, slots[2], marker, workdir)
    out.update({f"cpu applier {k}": v for k, v in cpu.items()})
    out["applier_rss_mb"] = rss / 1024**2
    for s in slots:
        sh(pub, f"SELECT pg_drop_replication_slot('{s}')")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--txns", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workloads", default="insert,pgbench")
    args = ap.parse_args()
    settings = {"logical_decoding_work_mem": "64MB", "max_wal_size": "4GB"}
    with tempfile.TemporaryDirectory() as tmp, local_cluster(15, settings=settings) as pub, \
            local_cluster(15, name="sub", settings=settings) as sub:  # fmt: skip
        workdir = Path(tmp)
        pub.create_database(DB)
        sub.create_database(DB)
        for workload in args.workloads.split(","):
            runs = [bench(pub, sub, workload, args, workdir, i) for i in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            size = f"{args.rows} rows" if workload == "insert" else f"{args.txns} txns"
            print(f"{workload} ({size}, median of {args.repeat}):")
            print(f"  pg_recvlogical {med['pg_recvlogical']:8.2f} s")
            print(f"  built-in       {med['builtin']:8.2f} s")
            rss = med["applier_rss_mb"]
            print(f"  applier        {med['applier']:8.2f} s  (peak RSS {rss:.0f} MB)")
            print(f"  applier/built-in       {med['applier'] / med['builtin']:.2f}")
            print(f"  applier/pg_recvlogical {med['applier'] / med['pg_recvlogical']:.2f}")
            print("  CPU seconds (median):")
            for k in sorted(k for k in med if k.startswith("cpu ") and "wall" not in k):
                print(f"    {k[4:]:32s} {med[k]:6.2f}")
            start = med.get("cpu applier start-up (wall)")
            if start is not None:
                streaming = med["applier"] - start
                print(
                    f"  applier start-up (until START_REPLICATION) {start:.2f} s, then "
                    f"{streaming:.2f} s streaming ({streaming / med['builtin']:.2f}x built-in)"
                )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
