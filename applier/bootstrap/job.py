"""``applier bootstrap``: the one-off copy of the included tables, as a Spark job.

Order of work
-------------
1. Checks: both servers reachable, publications exist, every privilege
   both roles need (:mod:`applier.privileges`: one refusal naming every
   GRANT, before even the applier schema is created), a pg_dump and psql as
   new as the source (:mod:`.clients`), column types exist
   (or can be created) on the target, existing target tables are empty (or
   ``--truncate``) and have every copied column, the slot does not exist (or
   ``--recreate-slot``, or our own interrupted run made it). Every refusal
   comes here, before anything is changed: only then are types created,
   tables truncated and a slot dropped. A published table without a replica
   identity is copied, with a warning (its UPDATEs and DELETEs fail on the
   source). Plain tables are named with ``ONLY`` (row checks, TRUNCATE, the
   copies): an inheritance child is a table of its own, never reached
   through its parent; partitioned tables are emptied as a whole.
   Target sessions are pinned (:mod:`.sessions`).
2. The slot is created over a replication connection with an *exported
   snapshot*. That snapshot lives only while the connection stays idle, so
   the connection is held open, untouched, until every copy task and the
   schema dump are finished. The driver imports it too (``BEGIN ISOLATION
   LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT``) to dump the
   missing tables' DDL (``pg_dump --snapshot``) and read sequence values.
3. Pre-data DDL; then the Spark job: one task per ctid slice; each task
   imports the same snapshot, so all slices together are the source at the
   slot's consistent point. A slice's rows and its done-record commit in one
   target transaction (:mod:`.copy_task`), so Spark retries never duplicate.
   Then the large objects, in the driver, under the same snapshot
   (:mod:`.largeobjects`): the stream cannot carry them.
4. Post-data DDL (PKs, indexes, constraints) once the data is in, sequences,
   and the hand-off: the target's replication origin ``cfg.origin`` is
   created and advanced to the consistent point, in which ``applier run``
   resumes: the slot streams exactly the transactions committed after the
   snapshot, and the origin says that nothing before it is to be replayed.

Reruns (the bookkeeping in ``applier.bootstrap_run``, one row per slot)
----------------------------------------------------------------------
* Phase ``starting``/``copy`` (the process died while copying): the exported
  snapshot died with it, and slices copied under it cannot be mixed with
  slices copied under a new one (a finished table would miss the changes
  between the two consistent points, and the apply has no per-table start
  point). So the rerun starts the copy over: it drops the slot it created,
  truncates the tables the interrupted run was filling (no ``--truncate``
  needed: the bookkeeping proves they are ours), and copies everything under
  a new slot and snapshot. Within one run, Spark task retries reuse the
  snapshot and the done-records, and nothing is copied twice.
* Phase ``post_data`` (all data is in): the snapshot is no longer needed; the
  DDL and sequence values were kept in the run row, so the rerun finishes the
  post-data DDL, sequences and origin against the slot, which still holds the
  consistent point.
* Phase ``done``: refused unless ``--recreate-slot`` (and ``--truncate`` for
  the now non-empty tables): a second bootstrap is a deliberate act.
* A slot that exists without an unfinished run of ours is refused with a hint
  to use ``--recreate-slot``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from applier.apply.sql.mapping import Catalog

from ..config import Config
from ..errors import AlreadyBootstrapped, BootstrapError, BootstrapRefused
from ..lsn import Lsn
from ..privileges import check, scope_of
from ..stream.versions import check_source
from . import clients
from . import largeobjects as large_objects
from . import schema as ddl
from .checks import check_slot, check_target, truncate_tables
from .copy_task import SliceResult, SliceTask, copy_slice
from .plan import (
    SourcePlan,
    TableSpec,
    cut_slices,
    discover,
    published_tables,
    quote_qual,
    target_columns,
)
from .progress import BootstrapProgress, TableProgress, poll_stats
from .sequences import SeqValue, connect, read_values, sequences_of, set_values
from .spark import SparkStarter, copy_slots, spark_failure

log = logging.getLogger(__name__)
Conn = psycopg.Connection[Any]


@dataclass
class PriorRun:
    run_id: int
    phase: str
    consistent_lsn: str | None
    post_data_sql: str | None
    sequences: list[SeqValue]
    tables: list[tuple[str, str]] = field(default_factory=list)  # dst tables it filled
    created: list[tuple[str, str]] = field(default_factory=list)  # src tables it created


def run_bootstrap(cfg: Config, *, recreate_slot: bool, truncate: bool, quiet: bool) -> int:
    src_dsn, tgt_dsn = cfg.source.conninfo(), cfg.target.conninfo()
    with connect(src_dsn, "source") as src, connect(tgt_dsn, "target") as tgt:
        spark = SparkStarter(cfg)
        try:
            return _bootstrap(cfg, src, tgt, spark, recreate_slot, truncate, quiet)
        finally:
            spark.abandon()  # a no-op after a success (stopped already)


def _bootstrap(
    cfg: Config,
    src: Conn,
    tgt: Conn,
    spark: SparkStarter,
    recreate_slot: bool,
    truncate: bool,
    quiet: bool,
) -> int:
    from ..schema import schema_at_head, upgrade_target

    check_source(src.info.server_version, failover=cfg.source.failover, binary=cfg.apply.binary)
    # Before anything is made (the applier schema, the slot, a table), and
    # before discovery (which needs USAGE on the schemas): every privilege
    # either role lacks, then pg_dump/psql as new as the source.
    scope = scope_of(
        src, published_tables(src, cfg), creates=True, truncate=truncate,
        large_objects=cfg.bootstrap.large_objects,
    )  # fmt: skip
    check("bootstrap", scope, source=src, target=tgt)
    plan = discover(src, cfg)
    clients.pick(cfg.source.conninfo(), plan.source_major, cfg.bootstrap.client_bin_dir)
    # A cluster's executors have what the copy needs (modules, psql, reach to
    # both servers), before anything is made; a no-op on a local master.
    spark.preflight(plan.source_major)
    # As `applier run` does: alembic (0.25 s of imports) only when there is
    # something to migrate.
    if not schema_at_head(tgt):
        upgrade_target(cfg.target.conninfo())
    prior = load_prior_run(tgt, cfg.source.slot)
    if prior and prior.phase == "post_data" and not recreate_slot:
        log.info("resuming an interrupted bootstrap after its copy")
        return finish(cfg, tgt, prior)
    if prior and prior.phase == "done" and not recreate_slot:
        raise AlreadyBootstrapped(
            f"slot {cfg.source.slot} was bootstrapped already "
            f"(consistent point {prior.consistent_lsn})",
            hint="start `applier run`; to bootstrap again use --recreate-slot --truncate",
        )
    ours = prior.tables if prior and prior.phase != "done" else []
    # Every refusal before the first change (types, truncation, slot).
    types = ddl.missing_types(src, tgt, plan.ddl_tables)
    to_empty = check_target(tgt, plan, ours=ours, truncate=truncate)
    check_slot(src, cfg.source.slot, recreate_slot or bool(prior and prior.phase != "done"))
    large_objects.check(cfg, src, tgt, replace=truncate)
    ddl.create_types(src, tgt, types)
    truncate_tables(tgt, to_empty)
    run = copy_under_new_slot(
        cfg, src, tgt, plan, prior, recreate_slot, quiet, spark, truncate=truncate
    )
    # Spark stops (about a second) while the post-data DDL runs.
    stopper = threading.Thread(target=spark.stop, name="spark-stop", daemon=True)
    stopper.start()
    try:
        return finish(cfg, tgt, run)
    finally:
        stopper.join()


def load_prior_run(tgt: Conn, slot: str) -> PriorRun | None:
    row = tgt.execute(
        "SELECT run_id, phase, consistent_lsn::text, post_data_sql, sequences "
        "FROM applier.bootstrap_run WHERE slot = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    tables = tgt.execute(
        "SELECT dst_schema, dst_name, created, src_schema, src_name "
        "FROM applier.bootstrap_table WHERE slot = %s AND run_id = %s",
        (slot, row[0]),
    ).fetchall()
    seqs = [(s[0], s[1], int(s[2]), bool(s[3])) for s in (row[4] or [])]
    return PriorRun(
        run_id=row[0],
        phase=row[1],
        consistent_lsn=row[2],
        post_data_sql=row[3],
        sequences=seqs,
        tables=sorted({(t[0], t[1]) for t in tables}),
        created=sorted({(t[3], t[4]) for t in tables if t[2]}),
    )


def start_run(tgt: Conn, slot: str) -> int:
    """A new run id, recorded (phase 'starting') before the slot is created."""
    with tgt.transaction():
        row = tgt.execute("SELECT nextval('applier.bootstrap_run_id')").fetchone()
        assert row is not None
        run_id = int(row[0])
        tgt.execute("DELETE FROM applier.bootstrap_slice WHERE slot = %s", (slot,))
        tgt.execute("DELETE FROM applier.bootstrap_table WHERE slot = %s", (slot,))
        tgt.execute(
            "INSERT INTO applier.bootstrap_run (slot, run_id, phase) VALUES (%s, %s, 'starting') "
            "ON CONFLICT (slot) DO UPDATE SET run_id = excluded.run_id, phase = 'starting', "
            "snapshot_name = NULL, consistent_lsn = NULL, post_data_sql = NULL, "
            "sequences = NULL, started_at = now(), finished_at = NULL",
            (slot, run_id),
        )
    return run_id


def record_copy_phase(
    tgt: Conn, slot: str, run: PriorRun, snapshot: str, plan: SourcePlan, created: set[Any]
) -> None:
    with tgt.transaction():
        tgt.execute(
            "UPDATE applier.bootstrap_run SET phase = 'copy', snapshot_name = %s, "
            "consistent_lsn = %s::pg_lsn, post_data_sql = %s, sequences = %s::jsonb "
            "WHERE slot = %s",
            (snapshot, run.consistent_lsn, run.post_data_sql, json.dumps(run.sequences), slot),
        )
        for t in plan.tables:
            assert t.dst is not None
            tgt.execute(
                "INSERT INTO applier.bootstrap_table (slot, run_id, src_schema, src_name, "
                "dst_schema, dst_name, created, slices, est_bytes, est_rows, src_relid) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (slot, run.run_id, t.schema, t.name, *t.dst, (t.schema, t.name) in created,
                 len(t.slices), t.heap_bytes, t.est_rows, t.relid),
            )  # fmt: skip


def set_phase(tgt: Conn, slot: str, phase: str) -> None:
    tgt.execute(
        "UPDATE applier.bootstrap_run SET phase = %s, "
        "finished_at = CASE WHEN %s = 'done' THEN now() END WHERE slot = %s",
        (phase, phase, slot),
    )


# -- target tables ------------------------------------------------------------------


def resolve_targets(tgt: Conn, plan: SourcePlan, slice_size: int, workers: int = 1) -> None:
    """Pick each heap's target table (same name, else its root), columns, format, slices."""
    catalog = Catalog(tgt)  # one cache of the target's types for every table
    for t in plan.tables:
        t.dst = (t.schema, t.name)
        if ddl.missing_tables(tgt, [t.dst]):
            t.dst = t.root
            if ddl.missing_tables(tgt, [t.dst]):
                raise BootstrapError(f"target table {t.qualname} does not exist after pre-data")
        dst_cols = target_columns(tgt, *t.dst)
        lacking = [c.name for c in t.columns if c.name not in dst_cols]
        if lacking:
            raise BootstrapRefused(
                f"target table {t.dst[0]}.{t.dst[1]} lacks column(s) {', '.join(lacking)}",
                hint="add the columns on the target (same types as on the source) and rerun",
            )
        same_types = all(dst_cols[c.name] == c.type_name for c in t.columns)
        t.binary = same_types and not catalog.binary_doubts(*t.dst)  # composites: text
        t.slices = cut_slices(t.blocks, t.heap_bytes, slice_size, workers)


# -- the copy -------------------------------------------------------------------------


def copy_under_new_slot(
    cfg: Config,
    src: Conn,
    tgt: Conn,
    plan: SourcePlan,
    prior: PriorRun | None,
    recreate_slot: bool,
    quiet: bool,
    spark: SparkStarter,
    *,
    truncate: bool = False,
) -> PriorRun:
    """Slot, schema, copy (on the context ``spark`` is starting); the caller stops Spark.

    ``truncate``: large objects the target has with other data are replaced.
    """
    from ..stream.replconn import ReplicationConnection

    slot = cfg.source.slot
    interrupted = prior is not None and prior.phase in ("starting", "copy", "post_data")
    repl = ReplicationConnection.open(cfg.source.conninfo(), application_name="applier-bootstrap")
    try:
        exists = repl.slot_exists(slot)
        if exists and not (recreate_slot or interrupted):
            raise BootstrapRefused(
                f"replication slot {slot} exists already on the source",
                hint="use --recreate-slot to drop it and bootstrap anew "
                "(any consumer of that slot loses its position)",
            )
        # The JVM boots while the slot, the schema dump and the tables are
        # made. Not before the checks: a JVM still booting when a bad-input
        # error ends the process would print after that error.
        spark.start()
        if exists:
            log.warning("dropping replication slot", extra={"ctx": {"slot": slot}})
            repl.drop_slot(slot)
        run_id = start_run(tgt, slot)
        # The origin will replicate from this source (checked by `applier run`).
        # Before the slot: the exported snapshot dies with the next command on `repl`.
        from applier.apply.target.preflight import record_source

        record_source(tgt, cfg.origin, slot, repl.identify_system())
        info = repl.create_slot(
            slot, snapshot="export", two_phase=cfg.apply.two_phase, failover=cfg.source.failover
        )
        assert info.snapshot_name is not None
        # From here until every task is done, `repl` must stay idle and open.
        run = PriorRun(run_id, "copy", str(info.consistent_point), None, [])
        # Created tables and the record saying so commit together: a crash in
        # between cannot leave tables that a rerun takes for the user's own.
        with tgt.transaction():
            bindir = clients.pick(
                cfg.source.conninfo(), plan.source_major, cfg.bootstrap.client_bin_dir
            )
            created = _dump_and_create(
                cfg.source.conninfo(), src, tgt, plan, prior, info.snapshot_name, run, bindir
            )
            sc = spark.context()
            resolve_targets(tgt, plan, cfg.bootstrap.slice_size, copy_slots(cfg, sc))
            run.post_data_sql = (run.post_data_sql or "") + defer_autovacuum(
                src, tgt, plan, created
            )
            record_copy_phase(tgt, slot, run, info.snapshot_name, plan, created)
        run_copy(cfg, sc, tgt, plan, run_id, info.snapshot_name, quiet)
        # The snapshot is still held (repl is idle).
        large_objects.copy(cfg, src, tgt, info.snapshot_name, replace=truncate)
        set_phase(tgt, slot, "post_data")
        run.phase = "post_data"
        return run
    finally:
        repl.close()


def _dump_and_create(
    cfg_source_dsn: str,
    src: Conn,
    tgt: Conn,
    plan: SourcePlan,
    prior: PriorRun | None,
    snapshot: str,
    run: PriorRun,
    bindir: Path,
) -> set[tuple[str, str]]:
    """Under the snapshot: dump DDL, read sequences; create missing tables. Returns created."""
    missing = ddl.missing_tables(tgt, plan.ddl_tables)
    # Tables an interrupted run created still need their post-data DDL.
    created = set(missing)
    if prior and prior.phase != "done" and prior.post_data_sql is not None:
        created |= {t for t in prior.created if t in set(plan.ddl_tables)}
    src_dsn = cfg_source_dsn
    src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        src.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        ordered = [t for t in plan.ddl_tables if t in created]
        pre = ddl.dump(src_dsn, missing, "pre-data", snapshot, bindir) if missing else ""
        run.post_data_sql = (
            ddl.dump(src_dsn, ordered, "post-data", snapshot, bindir) if ordered else ""
        )
        run.sequences = read_values(src, sequences_of(src, plan.ddl_tables))
    finally:
        src.execute("ROLLBACK")
    if missing:
        ddl.ensure_schemas(tgt, {s for s, _ in missing})
        ddl.run_script(tgt, pre, f"{len(missing)} table(s)")
        log.info("tables created on the target", extra={"ctx": {"tables": len(missing)}})
    return created


def defer_autovacuum(src: Conn, tgt: Conn, plan: SourcePlan, created: set[tuple[str, str]]) -> str:
    """Autovacuum off on the heaps this run created until their post-data DDL.

    Each slice commits on its own, so autovacuum would start on a table still
    being loaded, take CPU from the copy, and then hold up the primary key's
    ALTER TABLE by up to ``deadlock_timeout`` before it lets itself be
    cancelled. Returns the SQL that gives each table the source's own
    setting back; it runs with the post-data DDL, in its transaction. Tables
    the user created are left as they are.
    """
    heaps = [
        (t.schema, t.name)
        for t in plan.tables
        if (t.schema, t.name) in created and t.dst == (t.schema, t.name)
    ]
    source_options = _autovacuum_options(src, heaps)
    restore = []
    for heap in heaps:
        ident = sql.Identifier(*heap)
        tgt.execute(
            sql.SQL(
                "ALTER TABLE {} SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)"
            ).format(ident)
        )
        stmt = sql.SQL(
            "ALTER TABLE {} RESET (autovacuum_enabled, toast.autovacuum_enabled)"
        ).format(ident)
        main, toast = source_options.get(heap, (None, None))
        sets = [sql.SQL("autovacuum_enabled = {}").format(sql.Literal(main))] if main else []
        if toast:
            sets.append(sql.SQL("toast.autovacuum_enabled = {}").format(sql.Literal(toast)))
        if sets:
            stmt = sql.SQL("{}, SET ({})").format(stmt, sql.SQL(", ").join(sets))
        restore.append(stmt.as_string(tgt) + ";\n")
    return "".join(restore)


def _autovacuum_options(
    src: Conn, heaps: list[tuple[str, str]]
) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    """The source's autovacuum_enabled of each heap and of its TOAST table, in one query."""
    if not heaps:
        return {}
    rows = src.execute(
        "SELECT n.nspname, c.relname, "
        "       (SELECT option_value FROM pg_options_to_table(c.reloptions) "
        "        WHERE option_name = 'autovacuum_enabled'), "
        "       (SELECT option_value FROM pg_options_to_table(tc.reloptions) "
        "        WHERE option_name = 'autovacuum_enabled') "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_class tc ON tc.oid = c.reltoastrelid "
        "WHERE c.oid = ANY(%s::regclass[])",
        ([quote_qual(*h) for h in heaps],),
    ).fetchall()
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


def build_tasks(
    cfg: Config,
    plan: SourcePlan,
    run_id: int,
    snapshot: str,
    dsns: tuple[str, str] | None = None,
) -> list[SliceTask]:
    """The slices' tasks; ``dsns``: (source, target) as the tasks connect (default: the
    driver's, see :func:`.executors.task_dsns`)."""
    src_dsn, tgt_dsn = dsns or (cfg.source.conninfo(), cfg.target.conninfo())
    tasks = []
    for t in plan.tables:
        assert t.dst is not None
        for s in t.slices:
            tasks.append(
                SliceTask(
                    source_conninfo=src_dsn,
                    source_version=plan.source_version,
                    target_conninfo=tgt_dsn,
                    snapshot=snapshot,
                    slot=cfg.source.slot,
                    run_id=run_id,
                    src_schema=t.schema,
                    src_name=t.name,
                    dst_schema=t.dst[0],
                    dst_name=t.dst[1],
                    columns=tuple(c.name for c in t.columns),
                    binary=t.binary,
                    slice_no=s.slice_no,
                    where=s.where(t.row_filter),
                    parallelism=cfg.bootstrap.parallelism,
                    client_bin_dir=cfg.bootstrap.client_bin_dir,
                )
            )
    # Biggest tables' slices first: the long tail is then made of small slices.
    order = {t.qualname: -t.heap_bytes for t in plan.tables}
    tasks.sort(key=lambda k: (order[f"{k.src_schema}.{k.src_name}"], k.slice_no))
    return tasks


def run_copy(
    cfg: Config, sc: Any, tgt: Conn, plan: SourcePlan, run_id: int, snapshot: str,
    quiet: bool, command: str = "bootstrap",
) -> None:  # fmt: skip
    """Copy ``plan``'s slices under ``snapshot`` as one Spark job (with the progress
    display unless ``quiet``); used by bootstrap and by ``applier sync-tables``."""
    from .executors import task_dsns

    tasks = build_tasks(cfg, plan, run_id, snapshot, task_dsns(cfg, sc))
    outcome: dict[str, Any] = {}
    started = time.monotonic()

    def job() -> None:
        try:
            sc.setJobGroup(f"applier-bootstrap-{run_id}", "applier bootstrap copy")
            rdd = sc.parallelize(tasks, numSlices=len(tasks))
            outcome["results"] = rdd.map(copy_slice).collect()
        except BaseException as e:  # reported to the driver thread below
            outcome["error"] = e

    tables = [TableProgress(t.qualname, len(t.slices), t.heap_bytes) for t in plan.tables]
    with BootstrapProgress(tables, quiet=quiet) as progress:
        worker = threading.Thread(target=job, name="spark-copy", daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                worker.join(0.5)
                progress.update(poll_stats(tgt, cfg.source.slot, run_id))
        except KeyboardInterrupt:
            sc.cancelJobGroup(f"applier-bootstrap-{run_id}")
            raise
        progress.update(poll_stats(tgt, cfg.source.slot, run_id))
    if "error" in outcome:
        raise spark_failure(outcome["error"], command)
    results: list[SliceResult] = outcome["results"]
    progress.print_summary()
    log.info(
        "copy done",
        extra={
            "ctx": {
                "slices": len(results),
                "rows": sum(r.rows for r in results),
                "seconds": round(time.monotonic() - started, 1),
            }
        },
    )


# -- after the data -----------------------------------------------------------------


def finish(cfg: Config, tgt: Conn, run: PriorRun) -> int:
    """Post-data DDL, sequences, origin at the consistent point; phase 'done'."""
    _require_slot(cfg, run)
    if run.post_data_sql:
        started = time.monotonic()
        # The DDL and the forgetting of it commit together: a rerun never runs it twice.
        with tgt.transaction():
            index_build_settings(tgt, cfg.bootstrap.maintenance_work_mem)
            ddl.run_script(tgt, run.post_data_sql, "indexes and constraints")
            tgt.execute(
                "UPDATE applier.bootstrap_run SET post_data_sql = NULL WHERE slot = %s",
                (cfg.source.slot,),
            )
        log.info("post-data done", extra={"ctx": {"seconds": round(time.monotonic() - started, 1)}})
    nseq = set_values(tgt, run.sequences)
    assert run.consistent_lsn is not None
    # Again right before the hand-off: the post-data DDL may have taken hours.
    _require_slot(cfg, run)
    set_origin(tgt, cfg.origin, Lsn.parse(run.consistent_lsn))
    set_phase(tgt, cfg.source.slot, "done")
    log.info(
        "bootstrap done",
        extra={"ctx": {"origin": cfg.origin, "lsn": run.consistent_lsn, "sequences": nseq}},
    )
    return 0


def index_build_settings(tgt: Conn, mem_bytes: int) -> None:
    """maintenance_work_mem for the post-data transaction, unless the target's is higher.

    A primary key on tens of millions of rows then sorts in memory instead of
    spilling (what pg_restore's documentation advises for a load). Measured on
    20M bigint keys: 1GB spills (7.4 s), 2GB does not (4.9 s); a parallel
    build splits the memory among its workers. Memory is taken only as the
    sort grows, so small tables cost nothing.
    """
    kb = mem_bytes // 1024
    row = tgt.execute(
        "SELECT setting::bigint FROM pg_settings WHERE name = 'maintenance_work_mem'"
    ).fetchone()
    if kb and row is not None and int(row[0]) < kb:
        tgt.execute(sql.SQL("SET LOCAL maintenance_work_mem = {}").format(sql.Literal(f"{kb}kB")))


def _require_slot(cfg: Config, run: PriorRun) -> None:
    with connect(cfg.source.conninfo(), "source") as src:
        row = src.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (cfg.source.slot,),
        ).fetchone()
    if row is None:
        raise BootstrapError(
            f"replication slot {cfg.source.slot} is gone; the copied data cannot be continued",
            hint="rerun with --recreate-slot --truncate to bootstrap anew",
        )
    # Someone consumed the slot (an early `applier run`, pg_recvlogical): the
    # changes it confirmed past the consistent point would never reach the target.
    from applier.apply.target.preflight import check_slot_not_moved

    assert run.consistent_lsn is not None
    confirmed = Lsn.parse(row[0]) if row[0] else None
    check_slot_not_moved(cfg.source.slot, confirmed, Lsn.parse(run.consistent_lsn))


def set_origin(tgt: Conn, origin: str, lsn: Lsn) -> None:
    exists = tgt.execute(
        "SELECT 1 FROM pg_replication_origin WHERE roname = %s", (origin,)
    ).fetchone()
    if exists is None:
        tgt.execute("SELECT pg_replication_origin_create(%s)", (origin,))
    tgt.execute("SELECT pg_replication_origin_advance(%s, %s::pg_lsn)", (origin, str(lsn)))
    log.info("replication origin set", extra={"ctx": {"origin": origin, "lsn": lsn}})


__all__ = ["TableSpec", "run_bootstrap"]
