"""``applier demo``: the whole product on two throwaway local clusters.

It starts a source and a target cluster (PostgreSQL 15 -> 18 by default),
loads a sample schema with data of many types, runs ``applier bootstrap``
(the Spark job), then ``applier run`` as a real child process while a
workload writes to the source, waits until the target has caught up, stops
the worker with SIGTERM and prints a per-table comparison. Nothing is left
behind unless ``--keep`` is given.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from psycopg import sql
from rich.console import Console
from rich.table import Table

from .config import load_config
from .errors import ApplierError
from .localpg import LocalCluster, make_base_dir
from .origingroup import progress_sql

log = logging.getLogger("applier.demo")

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE customers (
    id bigserial PRIMARY KEY,
    name text NOT NULL,
    email text,
    mood mood,
    tags text[],
    profile jsonb,
    balance numeric(14, 2),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE orders (
    id bigserial PRIMARY KEY,
    customer_id bigint NOT NULL REFERENCES customers (id),
    amount numeric(12, 2) NOT NULL,
    placed_on date NOT NULL,
    during tstzrange,
    note text
);
CREATE TABLE events (
    id bigint GENERATED ALWAYS AS IDENTITY,
    at timestamptz NOT NULL,
    kind text NOT NULL,
    payload bytea,
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
CREATE TABLE events_2025 PARTITION OF events FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
CREATE TABLE audit_log (who text, what text, at timestamptz);
ALTER TABLE audit_log REPLICA IDENTITY FULL;
CREATE PUBLICATION demo_pub FOR ALL TABLES WITH (publish_via_partition_root = true);
"""

LOAD = """
INSERT INTO customers (name, email, mood, tags, profile, balance)
SELECT 'customer ' || g, 'c' || g || '@example.com', (ARRAY['sad','ok','happy'])[1 + g % 3]::mood,
       ARRAY['t' || g % 7, NULL, 'x'], jsonb_build_object('n', g, 'vip', g % 10 = 0),
       (g * 1.37)::numeric(14, 2)
FROM generate_series(1, %(rows)s / 4) g;
INSERT INTO orders (customer_id, amount, placed_on, during, note)
SELECT 1 + g % (%(rows)s / 4), (g % 1000) + 0.99, date '2026-01-01' + g % 300,
       tstzrange(timestamptz '2026-01-01' + g * interval '1 min', NULL), repeat('n', g % 50)
FROM generate_series(1, %(rows)s / 2) g;
INSERT INTO events (at, kind, payload)
SELECT timestamptz '2025-06-01' + g * interval '1 min', 'k' || g % 5, decode(md5(g::text), 'hex')
FROM generate_series(1, %(rows)s / 4) g;
INSERT INTO audit_log SELECT 'u' || g % 9, 'boot', now() FROM generate_series(1, 100) g;
"""

TABLES = ["customers", "orders", "events", "audit_log"]


def _workload(src: LocalCluster, db: str, seconds: float) -> int:
    """Random inserts/updates/deletes on the source; returns transactions committed."""
    rng = random.Random(42)
    txns = 0
    deadline = time.monotonic() + seconds
    with src.connect(db) as conn:
        while time.monotonic() < deadline:
            with conn.transaction():
                c = conn.execute(
                    "INSERT INTO customers (name, mood, tags, profile, balance) "
                    "VALUES (%s, 'happy', ARRAY['live'], '{\"live\": true}', 1.5) RETURNING id",
                    (f"live {txns}",),
                ).fetchone()
                assert c is not None
                conn.execute(
                    "INSERT INTO orders (customer_id, amount, placed_on) VALUES (%s, 9.99, now())",
                    (c[0],),
                )
                conn.execute(
                    "UPDATE customers SET balance = balance + 1 WHERE id = %s",
                    (rng.randint(1, 1000),),
                )
                conn.execute(
                    "INSERT INTO events (at, kind) VALUES (now() - interval '1 day', 'live')"
                )
                conn.execute("DELETE FROM audit_log WHERE ctid = (SELECT min(ctid) FROM audit_log)")
            txns += 1
    return txns


def _fingerprint(cluster: LocalCluster, db: str, table: str) -> tuple[int, str]:
    query = sql.SQL(
        "SELECT count(*), coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM {} t"
    ).format(sql.Identifier("public", table))
    with cluster.connect(db) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def _wait_caught_up(
    src: LocalCluster,
    dst: LocalCluster,
    db: str,
    origin: str,
    timeout: float,
    worker: subprocess.Popen[bytes],
) -> float:
    target_lsn = src.execute("SELECT pg_current_wal_lsn()::text", db)[0][0]
    start = time.monotonic()
    with dst.connect(db) as conn:
        while time.monotonic() - start < timeout:
            row = conn.execute(
                f"SELECT coalesce({progress_sql()} >= %s::pg_lsn, false)",
                (origin, target_lsn),
            ).fetchone()
            if row and row[0]:
                return time.monotonic() - start
            if worker.poll() is not None:
                raise ApplierError(f"applier run exited early with code {worker.returncode}")
            time.sleep(0.2)
    raise ApplierError(f"the target did not catch up with {target_lsn} within {timeout:.0f} s")


@contextlib.contextmanager
def _clusters(
    src_version: int, dst_version: int, keep: bool
) -> Iterator[tuple[LocalCluster, LocalCluster]]:
    base = make_base_dir("applier-demo-")
    src = LocalCluster(src_version, base, name="source")
    dst = LocalCluster(dst_version, base, name="target")
    try:
        src.init().start()
        dst.init().start()
        yield src, dst
    finally:
        if not keep:
            src.destroy()
            dst.destroy()
            # The config and the worker's log live beside the clusters.
            shutil.rmtree(base, ignore_errors=True)


def _write_config(base: Path, src: LocalCluster, dst: LocalCluster, db: str) -> Path:
    path = base / "applier-demo.toml"
    path.write_text(
        f"""[source]
dsn = "{src.dsn(db)}"
publications = ["demo_pub"]
slot = "applier_demo"
[target]
dsn = "{dst.dsn(db)}"
[tables]
include = ["public.*"]
[apply]
status_interval = 1.0
[bootstrap]
spark_master = "local[2]"
slice_size = "8MB"
parallelism = 2
spark_conf = {{ "spark.ui.enabled" = "false" }}
"""
    )
    return path


def run_demo(src_version: int, dst_version: int, *, rows: int, keep: bool) -> int:
    console = Console(stderr=True)
    db = "demo"
    with _clusters(src_version, dst_version, keep) as (src, dst):
        console.rule(f"applier demo: PostgreSQL {src_version} -> {dst_version}")
        src.create_database(db)
        dst.create_database(db)
        src.execute(SCHEMA, db)
        t0 = time.monotonic()
        src.execute(LOAD.replace("%(rows)s", str(int(rows))), db)
        console.print(f"sample data: {rows} rows loaded in {time.monotonic() - t0:.1f} s")
        cfg_path = _write_config(src.datadir.parent, src, dst, db)
        cfg = load_config(cfg_path)

        from .bootstrap.job import run_bootstrap

        t0 = time.monotonic()
        rc: int = run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=False)
        if rc != 0:
            return rc
        boot_s = time.monotonic() - t0
        summary = _stream_phase(console, src, dst, db, cfg_path, cfg.origin)
        summary["bootstrap_s"] = boot_s
        ok = _compare(console, src, dst, db, summary)
        if keep:
            console.print(f"clusters kept: source {src.dsn(db)}  target {dst.dsn(db)}")
            console.print(f"config: {cfg_path}")
        return 0 if ok else 1


def _stream_phase(
    console: Console, src: LocalCluster, dst: LocalCluster, db: str, cfg_path: Path, origin: str
) -> dict[str, Any]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    logfile = cfg_path.with_suffix(".log")
    with open(logfile, "wb") as logf:
        worker = subprocess.Popen(
            [sys.executable, "-m", "applier.cli", "run", "--config", str(cfg_path)],
            stdout=logf, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        try:
            console.print(f"applier run started (log: {logfile}); writing live changes for 10 s")
            txns = _workload(src, db, 10.0)
            console.print(f"{txns} live transactions committed on the source")
            catch_up = _wait_caught_up(src, dst, db, origin, timeout=120, worker=worker)
            console.print(f"target caught up {catch_up:.1f} s after the last source commit")
        finally:
            rc = _stop(worker)
            if rc != 0:
                console.print(f"[red]applier run exited with {rc}[/]; the end of its log:")
                console.print(logfile.read_text(errors="replace")[-3000:], markup=False)
    if rc != 0:
        raise ApplierError(f"applier run exited with code {rc}")
    return {"live_txns": txns, "catch_up_s": catch_up}


def _stop(worker: subprocess.Popen[bytes]) -> int:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        return worker.wait()


def _compare(
    console: Console, src: LocalCluster, dst: LocalCluster, db: str, summary: dict[str, Any]
) -> bool:
    table = Table(title="source vs target")
    for col in ("table", "source rows", "target rows", "equal"):
        table.add_column(col)
    ok = True
    for name in TABLES:
        s, d = _fingerprint(src, db, name), _fingerprint(dst, db, name)
        ok &= s == d
        table.add_row(name, str(s[0]), str(d[0]), "yes" if s == d else "[red]NO[/]")
    console.print(table)
    console.print(
        f"bootstrap {summary['bootstrap_s']:.1f} s; {summary['live_txns']} live transactions "
        f"replicated; caught up in {summary['catch_up_s']:.1f} s; "
        + ("[green]target equals source[/]" if ok else "[red]target differs from source[/]")
    )
    return ok
