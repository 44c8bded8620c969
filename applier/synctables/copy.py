"""Step 1 of :mod:`applier.synctables`: one table's slot, snapshot, creation and copy.

Everything the bootstrap does for one table, with the bootstrap's own pieces:
the slot is the table's (``tag``), the snapshot is exported by it, the DDL is
pg_dump's under that snapshot (:mod:`applier.bootstrap.schema`), the rows are
copied by the bootstrap's Spark job (:func:`applier.bootstrap.job.build_tasks`,
one done-record per slice in ``applier.bootstrap_slice`` under the slot
``tag``), indexes and constraints after the data, the owned sequences' values
from the snapshot. The post-data DDL, the origin ``tag`` and the state
``catchup`` commit together; the origin is then advanced to the consistent point.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import psycopg
from psycopg import sql

from applier.apply.target.origin import origin_progress

from ..bootstrap import schema as ddl
from ..bootstrap.clients import pick
from ..bootstrap.job import index_build_settings, resolve_targets, run_copy
from ..bootstrap.plan import SourcePlan, TableSpec
from ..bootstrap.sequences import read_values, sequences_of, set_values
from ..bootstrap.spark import copy_slots
from ..config import Config
from ..errors import BootstrapError
from ..lsn import Lsn

log = logging.getLogger(__name__)
Conn = psycopg.Connection[Any]
Name = tuple[str, str]


def set_state(tgt: Conn, origin: str, name: Name, state: str, **cols: Any) -> None:
    sets = [sql.SQL("state = {}").format(sql.Literal(state)), sql.SQL("updated_at = now()")]
    for col, value in cols.items():
        sets.append(sql.SQL("{} = {}").format(sql.Identifier(col), sql.Literal(value)))
    tgt.execute(
        sql.SQL(
            "UPDATE applier.table_sync SET {} WHERE origin = %s AND schema_name = %s "
            "AND table_name = %s"
        ).format(sql.SQL(", ").join(sets)),
        (origin, *name),
    )


def drop_slot(src: Conn, slot: str, wait: float = 30.0) -> None:
    """Drop ``slot`` if it exists; a walsender of a killed run may hold it for a moment."""
    found = "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s"
    drop = "SELECT pg_drop_replication_slot(%s)"
    if _drop_when_free(src, "replication slot", slot, found, drop, wait):
        log.info("replication slot dropped", extra={"ctx": {"slot": slot}})


def drop_origin(tgt: Conn, origin: str, wait: float = 30.0) -> None:
    """Drop ``origin`` if it exists. The catch-up's apply backend lets go of it only
    when it exits, a moment after its connection closed."""
    found = "SELECT 1 FROM pg_replication_origin WHERE roname = %s"
    drop = "SELECT pg_replication_origin_drop(%s)"
    _drop_when_free(tgt, "replication origin", origin, found, drop, wait)


def _drop_when_free(conn: Conn, what: str, name: str, found: str, drop: str, wait: float) -> bool:
    """Run ``drop`` while ``found`` finds ``name``, until it is no longer in use
    (55006: a walsender or backend holds it); whether it dropped it. In use after
    ``wait`` seconds: an error that says what to do."""
    deadline = time.monotonic() + wait
    while conn.execute(found, (name,)).fetchone():
        try:
            conn.execute(drop, (name,))
            return True
        except psycopg.errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise BootstrapError(
                    f"{what} {name} is in use",
                    hint="another sync-tables may be running for this table; stop it and rerun",
                ) from None
            time.sleep(0.1)
    return False


def copy_table(
    cfg: Config,
    tcfg: Config,
    src: Conn,
    tgt: Conn,
    t: TableSpec,
    state: str,
    created_before: bool,
    truncate: bool,
    spark: Any,
    quiet: bool,
) -> None:
    """From ``init``/``copying`` to ``catchup``: the table's rows at the slot's start."""
    from ..stream.replconn import ReplicationConnection

    name, tag = (t.schema, t.name), tcfg.source.slot
    spark.start()  # the JVM boots while the slot and the table are made
    # A previous attempt's snapshot is gone: its slot, origin and slices go too.
    drop_slot(src, tag)
    drop_origin(tgt, tag)
    tgt.execute("DELETE FROM applier.bootstrap_slice WHERE slot = %s", (tag,))
    present = not ddl.missing_tables(tgt, [name])
    if present:
        _empty(tgt, t, ours=state == "copying", truncate=truncate)
    types = ddl.missing_types(src, tgt, [name])
    ddl.create_types(src, tgt, types)
    repl = ReplicationConnection.open(src_conninfo(cfg), application_name="applier-sync-tables")
    try:
        info = repl.create_slot(tag, snapshot="export", two_phase=cfg.apply.two_phase)
        assert info.snapshot_name is not None
        lsn = Lsn(info.consistent_point)
        # From here until the copy is done `repl` stays idle (the snapshot lives in it).
        set_state(tgt, cfg.origin, name, "copying", lsn=str(lsn), slot=tag)
        log.info(
            "copying a table",
            extra={"ctx": {"table": t.qualname, "slot": tag, "snapshot_lsn": lsn}},
        )
        created = created_before or not present
        pre, post, seqs = _dump(cfg, src, name, info.snapshot_name, not present, created)
        pre, attach = split_attach(pre)
        plan = SourcePlan(ddl_tables=[name], tables=[t], source_version=src.info.server_version)
        sc = spark.context()
        with tgt.transaction():
            if not present:
                ddl.ensure_schemas(tgt, [t.schema])
                ddl.run_script(tgt, pre, f"table {t.qualname}")
                set_state(tgt, cfg.origin, name, "copying", created=True)
            resolve_targets(tgt, plan, cfg.bootstrap.slice_size, copy_slots(cfg, sc))
        row = tgt.execute("SELECT nextval('applier.bootstrap_run_id')").fetchone()
        assert row is not None
        run_copy(tcfg, sc, tgt, plan, int(row[0]), info.snapshot_name, quiet, "sync-tables")
    finally:
        repl.close()
    with tgt.transaction():
        if post:
            index_build_settings(tgt, cfg.bootstrap.maintenance_work_mem)
            ddl.run_script(tgt, post, f"indexes and constraints of {t.qualname}")
        if attach:
            ddl.run_script(tgt, attach, f"the attachment of partition {t.qualname}")
        set_values(tgt, seqs)
        if not tgt.execute(
            "SELECT 1 FROM pg_replication_origin WHERE roname = %s", (tag,)
        ).fetchone():
            tgt.execute("SELECT pg_replication_origin_create(%s)", (tag,))
        set_state(tgt, cfg.origin, name, "catchup")
    advance_origin(tgt, tag, lsn)


_TABLE_ATTACH = re.compile(r"^ALTER TABLE ONLY .* ATTACH PARTITION .*;$")
_INDEX_ATTACH = re.compile(r"^ALTER INDEX .* ATTACH PARTITION .*;$")


def split_attach(pre: str) -> tuple[str, str]:
    """A new partition of a table the target has: created alone, attached after its data
    and indexes. ATTACH PARTITION then adopts its indexes that match the parent's
    (pg_dump's ``ALTER INDEX ... ATTACH PARTITION`` lines are dropped: see _dump);
    attached first, the parent's indexes would be built on it and its own PRIMARY
    KEY refused as a second one."""
    keep: list[str] = []
    attach: list[str] = []
    for line in pre.splitlines():
        (attach if _TABLE_ATTACH.match(line) else keep).append(line)
    return "\n".join(keep) + "\n", "\n".join(attach) + "\n" if attach else ""


def advance_origin(tgt: Conn, tag: str, lsn: Lsn) -> None:
    """The origin at the snapshot's LSN (not transactional: after the state commits)."""
    if origin_progress(tgt, tag) < lsn:
        tgt.execute("SELECT pg_replication_origin_advance(%s, %s::pg_lsn)", (tag, str(lsn)))


def src_conninfo(cfg: Config) -> str:
    return cfg.source.conninfo()


def _empty(tgt: Conn, t: TableSpec, *, ours: bool, truncate: bool) -> None:
    ident = sql.Identifier(t.schema, t.name)
    has_rows = tgt.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM ONLY {})").format(ident))
    if not (has_rows.fetchone() or (False,))[0]:
        return
    if not (ours or truncate):
        raise BootstrapError(
            f"target table {t.qualname} is not empty",
            hint="empty it, or pass --truncate to have sync-tables empty it",
        )
    tgt.execute(sql.SQL("TRUNCATE ONLY {}").format(ident))
    log.info("target table emptied", extra={"ctx": {"table": t.qualname}})


def _dump(
    cfg: Config, src: Conn, name: Name, snapshot: str, pre: bool, post: bool
) -> tuple[str, str, list[Any]]:
    """pre-data and post-data DDL and sequence values, all under the snapshot."""
    src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        src.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        dsn = src_conninfo(cfg)
        bindir = pick(dsn, src.info.server_version // 10000, cfg.bootstrap.client_bin_dir)
        pre_sql = ddl.dump(dsn, [name], "pre-data", snapshot, bindir) if pre else ""
        post_sql = ddl.dump(dsn, [name], "post-data", snapshot, bindir) if post else ""
        post_sql = "\n".join(x for x in post_sql.splitlines() if not _INDEX_ATTACH.match(x))
        seqs = read_values(src, sequences_of(src, [name]))
    finally:
        src.execute("ROLLBACK")
    return pre_sql, post_sql, seqs
