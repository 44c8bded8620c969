"""The workloads: tables on both sides, the preload, the source-side run, the check.

Every workload's tables are created on both sides and preloaded (identically)
*before* any slot exists; the subscriber keeps a copy of the preloaded rows
(``_seed_<table>``, not published) so each consumer starts from the very same
target data. Only the listed tables and ``marker`` are published.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from applier.localpg import LocalCluster

from .common import DB, Ctx, WrongResult, log, sh

PGBENCH_TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")


@dataclass(frozen=True)
class Workload:
    name: str
    tables: tuple[str, ...]  # published (besides marker)
    preloaded: tuple[str, ...]  # reset from the seed copy; the others are truncated
    create: Callable[[Ctx], None]  # tables + preload on both sides
    run: Callable[[Ctx], None]  # on the source, after the slots exist
    describe: Callable[[Ctx], str]
    keyless: tuple[str, ...] = field(default=())  # no replica identity index (pglogical)
    full_identity: bool = False  # uses --full-timeout


def both(ctx: Ctx, sql: str) -> None:
    for c in (ctx.pub, ctx.sub):
        sh(c, sql)


def pgbench(ctx: Ctx, cluster: LocalCluster, *args: str) -> str:
    proc = subprocess.run(
        [cluster.bin("pgbench"), "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres",
         *args, DB],
        capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"pgbench {' '.join(args)} failed: {proc.stderr[-2000:]}")
    return proc.stdout


def pgbench_scale(ctx: Ctx) -> int:
    return max(1, round(10 * ctx.scale))


# -- 1. insert ---------------------------------------------------------------


def _create_insert(ctx: Ctx) -> None:
    both(ctx, "CREATE TABLE ins (id int PRIMARY KEY, v text, n numeric, t timestamptz)")


def _run_insert(ctx: Ctx) -> None:
    sh(ctx.pub, f"INSERT INTO ins SELECT g, md5(g::text), g / 7.0, now() "
                f"FROM generate_series(1, {ctx.n(1_000_000)}) g")  # fmt: skip


# -- 2. pgbench --------------------------------------------------------------


def _create_pgbench(ctx: Ctx) -> None:
    # pgbench -i generates the same rows on every run: both sides start equal
    # (the per-consumer check compares them anyway).
    for c in (ctx.pub, ctx.sub):
        pgbench(ctx, c, "-i", "-q", "-s", str(pgbench_scale(ctx)), "-I", "dtgvp")


def _run_pgbench(ctx: Ctx) -> None:
    clients = 4
    per_client = max(1, ctx.n(20_000) // clients)
    pgbench(ctx, ctx.pub, "-n", "-c", str(clients), "-t", str(per_client))


# -- 3. update / 4. delete ---------------------------------------------------


def _create_update(ctx: Ctx) -> None:
    both(ctx, "CREATE TABLE upd (id int PRIMARY KEY, v text, n int)")
    both(
        ctx,
        f"INSERT INTO upd SELECT g, md5(g::text), 0 FROM generate_series(1, {ctx.n(1_000_000)}) g",
    )
    both(ctx, "VACUUM ANALYZE upd")  # fmt: skip


def _run_update(ctx: Ctx) -> None:
    sh(ctx.pub, "UPDATE upd SET n = n + 1")


def _create_delete(ctx: Ctx) -> None:
    both(ctx, "CREATE TABLE del (id int PRIMARY KEY, v text, n int)")
    both(
        ctx,
        f"INSERT INTO del SELECT g, md5(g::text), g FROM generate_series(1, {ctx.n(1_000_000)}) g",
    )
    both(ctx, "VACUUM ANALYZE del")  # fmt: skip


def _run_delete(ctx: Ctx) -> None:
    sh(ctx.pub, "DELETE FROM del")


# -- 5. full: REPLICA IDENTITY FULL, no index anywhere -----------------------


def _create_full(ctx: Ctx) -> None:
    rows = ctx.n(100_000)
    both(ctx, "CREATE TABLE fullt (id int NOT NULL, v text, n int)")
    both(ctx, "ALTER TABLE fullt REPLICA IDENTITY FULL")
    both(ctx, f"INSERT INTO fullt SELECT g, md5(g::text), 0 FROM generate_series(1, {rows}) g")
    both(ctx, "VACUUM ANALYZE fullt")
    # Without an index the source would scan sequentially too (50,000 x 100,000
    # rows): the procedure updates by ctid instead, each chosen row once (so the
    # ctid it read up front stays valid), in a scattered order, one commit each.
    sh(
        ctx.pub,
        """
        CREATE PROCEDURE bump_full(cnt int) LANGUAGE plpgsql AS $$
        DECLARE
            tids tid[];
        BEGIN
            SELECT array_agg(ctid ORDER BY hashint4(id)) INTO tids
              FROM (SELECT ctid, id FROM fullt WHERE id % 2 = 0 LIMIT cnt) s;
            FOR i IN 1 .. coalesce(array_length(tids, 1), 0) LOOP
                UPDATE fullt SET n = n + 1 WHERE ctid = tids[i];
                COMMIT;
            END LOOP;
        END $$""",
    )


def _run_full(ctx: Ctx) -> None:
    sh(ctx.pub, f"CALL bump_full({ctx.n(50_000)})")


# -- 6. indexed: a primary key and three secondary indexes -------------------


def _create_indexed(ctx: Ctx) -> None:
    both(ctx, "CREATE TABLE idx (id int PRIMARY KEY, a int, b text, c timestamptz, d int)")
    both(ctx, "CREATE INDEX ON idx (a); CREATE INDEX ON idx (b); CREATE INDEX ON idx (c)")
    sh(
        ctx.pub,
        """
        CREATE PROCEDURE fill_idx(txns int, per int) LANGUAGE plpgsql AS $$
        BEGIN
            FOR i IN 0 .. txns - 1 LOOP
                INSERT INTO idx SELECT g, hashint4(g), md5(g::text),
                       '2026-01-01'::timestamptz + g * interval '1 s', g % 97
                  FROM generate_series(i * per + 1, (i + 1) * per) g;
                COMMIT;
            END LOOP;
        END $$""",
    )


def _run_indexed(ctx: Ctx) -> None:
    sh(ctx.pub, f"CALL fill_idx({ctx.n(200)}, 1000)")


# -- 8. big: one transaction of about --big-mb of row data --------------------


def big_rows(ctx: Ctx) -> int:
    return ctx.n(ctx.big_mb * 1024 * 1024 // 200)


def _create_big(ctx: Ctx) -> None:
    both(ctx, "CREATE TABLE bigt (id int PRIMARY KEY, v text)")


def _run_big(ctx: Ctx) -> None:
    sh(ctx.pub, f"INSERT INTO bigt SELECT g, rpad(g::text || md5(g::text), 200, 'x') "
                f"FROM generate_series(1, {big_rows(ctx)}) g")  # fmt: skip


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("insert", ("ins",), (), _create_insert, _run_insert,
                 lambda c: f"1 txn, {c.n(1_000_000):,} inserted rows"),
        Workload("pgbench", PGBENCH_TABLES, PGBENCH_TABLES[:3], _create_pgbench, _run_pgbench,
                 lambda c: f"{c.n(20_000):,} pgbench TPC-B txns (scale {pgbench_scale(c)}, "
                           "4 clients)",
                 keyless=("pgbench_history",)),
        Workload("update", ("upd",), ("upd",), _create_update, _run_update,
                 lambda c: f"1 txn, {c.n(1_000_000):,} updated rows (non-key column)"),
        Workload("delete", ("del",), ("del",), _create_delete, _run_delete,
                 lambda c: f"1 txn, {c.n(1_000_000):,} deleted rows"),
        Workload("full", ("fullt",), ("fullt",), _create_full, _run_full,
                 lambda c: f"{c.n(50_000):,} single-row UPDATEs, REPLICA IDENTITY FULL, "
                           f"{c.n(100_000):,} rows, no index",
                 keyless=("fullt",), full_identity=True),
        Workload("indexed", ("idx",), (), _create_indexed, _run_indexed,
                 lambda c: f"{c.n(200) * 1000:,} rows inserted in {c.n(200)} txns, "
                           "PK + 3 indexes"),
        Workload("big", ("bigt",), (), _create_big, _run_big,
                 lambda c: f"1 txn, {big_rows(c):,} rows of 200 bytes "
                           f"(~{big_rows(c) * 200 / 2**20:,.0f} MB)"),
    )
}  # fmt: skip


def prepare(ctx: Ctx, w: Workload) -> None:
    """Fresh tables on both sides, preloaded; the seed copies; the publication."""
    tables = ", ".join((*w.tables, "marker"))
    for c in (ctx.pub, ctx.sub):
        sh(c, "DROP PUBLICATION IF EXISTS pub")
        sh(c, f"DROP TABLE IF EXISTS {tables}, {', '.join(PGBENCH_TABLES)} CASCADE")
        sh(c, "DROP PROCEDURE IF EXISTS bump_full, fill_idx")
        sh(c, "CREATE TABLE marker (id int PRIMARY KEY)")
    w.create(ctx)
    for t in w.preloaded:
        sh(ctx.sub, f"DROP TABLE IF EXISTS _seed_{t}; CREATE TABLE _seed_{t} AS TABLE {t}")
    sh(ctx.pub, f"CREATE PUBLICATION pub FOR TABLE {tables}")


def reset_target(ctx: Ctx, w: Workload) -> None:
    """The target back to its pre-workload state (outside any timing)."""
    for t in (*w.tables, "marker"):
        sh(ctx.sub, f"TRUNCATE {t}")
        if t in w.preloaded:
            sh(ctx.sub, f"INSERT INTO {t} SELECT * FROM _seed_{t}")
        sh(ctx.sub, f"ANALYZE {t}")
    sh(ctx.sub, "CHECKPOINT")


def fingerprint(cluster: LocalCluster, w: Workload) -> dict[str, tuple[int, int]]:
    """Per table: row count and an order-independent hash of every row's text."""
    out = {}
    for t in w.tables:
        n, h = sh(cluster, f"SELECT count(*), coalesce(sum(hashtext(x::text)::bigint), 0) "
                           f"FROM {t} x")[0]  # fmt: skip
        out[t] = (int(n), int(h))
    return out


def check_target(ctx: Ctx, w: Workload, want: dict[str, tuple[int, int]], who: str) -> None:
    """Fail loudly when a consumer's target differs from the source: a fast wrong
    consumer must not look good."""
    got = fingerprint(ctx.sub, w)
    if got != want:
        bad = {t: (want[t], got[t]) for t in want if want[t] != got.get(t)}
        raise WrongResult(
            f"{who} on {w.name}: the target differs from the source "
            f"(table: ((rows, hash) source, (rows, hash) target)): {bad}"
        )
    rows = ", ".join(f"{t} {n:,} rows" for t, (n, _) in got.items())
    log(f"    {who}: target matches the source ({rows})")
