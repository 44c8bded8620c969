"""``applier sync-tables``: which tables, in which step, and the cleanup.

See :mod:`applier.synctables` for the protocol. This module picks the tables
(published and included, narrowed by ``--tables``; missing on the target and
unknown to applier, or with an unfinished row), runs each from the step its
row is in, reports and forgets the rows of tables no longer published or
included, and drops what finished syncs left (slot, origin, done-records).
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any

import msgspec
import psycopg

from applier.apply.rules.tablesync import MARK_READY
from applier.apply.target.holder import last_worker

from ..bootstrap.clients import pick
from ..bootstrap.plan import published_tables
from ..config import Config, TablesConfig, table_matches
from ..errors import BootstrapError, BootstrapRefused, ConfigError, PermanentError
from ..privileges import check, scope_of
from .copy import drop_origin, drop_slot

log = logging.getLogger(__name__)
Conn = psycopg.Connection[Any]
Name = tuple[str, str]

_DONE = ("syncdone", "ready")


def sync_tag(origin: str, name: Name) -> str:
    """The table's slot and origin name: stable across reruns, a valid slot name."""
    digest = hashlib.sha1(f"{origin}\0{name[0]}\0{name[1]}".encode()).hexdigest()[:16]
    return f"applier_sync_{digest}"


def table_config(cfg: Config, name: Name, tag: str) -> Config:
    """``cfg`` for the table's catch-up: its slot, its origin, only this table."""
    return msgspec.structs.replace(
        cfg,
        source=msgspec.structs.replace(cfg.source, slot=tag),
        target=msgspec.structs.replace(cfg.target, origin=tag),
        tables=TablesConfig(include=[f"{_literal(name[0])}.{_literal(name[1])}"]),
    )


def _literal(part: str) -> str:
    """An fnmatch pattern matching exactly ``part``."""
    return re.sub(r"([*?\[])", r"[\1]", part)


def run_sync_tables(
    cfg: Config,
    patterns: list[str],
    *,
    truncate: bool,
    timeout: float,
    quiet: bool,
    without_worker: bool = False,
) -> int:
    from ..bootstrap.plan import discover
    from ..bootstrap.sequences import connect
    from ..bootstrap.spark import SparkStarter
    from ..schema import schema_at_head, upgrade_target
    from ..stream.versions import check_source

    for p in patterns:
        if p.count(".") != 1:
            raise ConfigError(f"--tables {p!r}: expected schema.table, '*' allowed")
    if cfg.apply.two_phase:
        # A transaction prepared before the handover and committed after it would be
        # prepared by one side and committed by the other (see the package docstring).
        raise ConfigError(
            "sync-tables does not support [apply] two_phase = true yet",
            hint="copy the table with a new `applier bootstrap`, or run with two_phase off",
        )
    with (
        connect(cfg.source.conninfo(), "source") as src,
        connect(cfg.target.conninfo(), "target") as tgt,
    ):
        check_source(src.info.server_version, failover=False, binary=cfg.apply.binary)
        # Before the migrations, a slot or a table (and before discovery, which needs
        # USAGE on the schemas): every grant either role lacks, in one refusal.
        scope = scope_of(src, published_tables(src, cfg), creates=True, truncate=truncate)
        check("sync-tables", scope, source=src, target=tgt)
        plan = discover(src, cfg)
        pick(cfg.source.conninfo(), plan.source_major, cfg.bootstrap.client_bin_dir)
        if not schema_at_head(tgt):
            upgrade_target(cfg.target.conninfo())
        _lock(tgt, cfg.origin)
        forget_stale(src, tgt, cfg)
        rows = _rows(tgt, cfg.origin)
        forget_removed(src, tgt, cfg, rows, set(plan.ddl_tables))
        tgt.execute(MARK_READY, (cfg.origin, cfg.origin))
        cleanup_finished(src, tgt, cfg)
        rows = _rows(tgt, cfg.origin)
        todo = _pick(tgt, cfg, plan, rows, patterns)
        if not todo:
            log.info("no table to sync", extra={"ctx": {"origin": cfg.origin}})
            print("sync-tables: nothing to copy (every included table is on the target)")
            return 0
        if not without_worker and any(_copies(rows.get((t.schema, t.name))) for t in todo):
            check_worker_runs(tgt, cfg)
        # Started by the first copy (a resumed catch-up needs none).
        spark = SparkStarter(cfg, "sync-tables")
        try:
            if any(_copies(rows.get((t.schema, t.name))) for t in todo):
                # A cluster's executors have what the copy needs, before any slot is made.
                spark.preflight(plan.source_major)
            for t in todo:
                _sync_one(cfg, src, tgt, t, rows.get((t.schema, t.name)), spark, truncate,
                          timeout, quiet)  # fmt: skip
            spark.stop()
        finally:
            spark.abandon()  # on an error: without waiting for a JVM still booting
        print(f"sync-tables: {len(todo)} table(s) copied and handed over to applier run: "
              + ", ".join(t.qualname for t in todo))  # fmt: skip
    return 0


def _copies(row: tuple[str, bool, str | None] | None) -> bool:
    """Whether this table's sync starts with (or is in) its copy."""
    return row is None or row[0] in ("skipped", "init", "copying")


def check_worker_runs(tgt: Conn, cfg: Config) -> None:
    """Refuse (exit 3) before a copy when no worker runs to hand the table over to.

    Without one the copy and catch-up end in ``syncwait`` and the command waits
    its whole ``--timeout`` (600 s) for nothing. A worker runs when its status
    row says running (or starting) with a heartbeat fresher than three
    ``[apply] status_interval``, as ``applier status`` judges it.
    """
    last = last_worker(tgt, cfg.origin)
    if last is not None and last.runs(cfg.apply.status_interval):
        return
    why = "it never started" if last is None else last.why_not_running(cfg.apply.status_interval)
    raise PermanentError(
        f"no `applier run` is running for origin {cfg.origin!r} ({why}): sync-tables "
        "hands each copied table over to it and would wait --timeout for nothing",
        hint="start `applier run` first, then rerun sync-tables (or pass --without-worker "
        "to copy now and wait --timeout for a worker)",
        origin=cfg.origin,
    )


def _lock(tgt: Conn, origin: str) -> None:
    """One sync-tables per origin at a time (held until the connection closes)."""
    row = tgt.execute(
        "SELECT pg_try_advisory_lock(hashtext('applier sync-tables'), hashtext(%s))", (origin,)
    ).fetchone()
    if not row or not row[0]:
        raise BootstrapError(
            f"another sync-tables runs for origin {origin}",
            hint="wait for it to finish (or stop it), then rerun",
        )


def forget_stale(src: Conn, tgt: Conn, cfg: Config) -> None:
    """Unfinished rows older than a finished bootstrap of the slot: that bootstrap copied
    every published table anew (the worker ignores these rows already); their leftovers
    go, and the rows too (a table the bootstrap did not copy is unknown again)."""
    for s, n, tag in tgt.execute(
        "SELECT t.schema_name, t.table_name, t.slot FROM applier.table_sync t "
        "JOIN applier.bootstrap_run b ON b.slot = %s AND b.phase = 'done' "
        "WHERE t.origin = %s AND t.state NOT IN ('syncdone', 'ready') "
        "AND t.updated_at < b.finished_at",
        (cfg.source.slot, cfg.origin),
    ).fetchall():
        log.warning(
            "sync state of %s.%s predates the last bootstrap: forgotten",
            s,
            n,
            extra={"ctx": {"table": f"{s}.{n}"}},
        )
        if tag:
            _cleanup(src, tgt, tag)
        tgt.execute(
            "DELETE FROM applier.table_sync WHERE origin = %s AND schema_name = %s "
            "AND table_name = %s",
            (cfg.origin, s, n),
        )


def _rows(tgt: Conn, origin: str) -> dict[Name, tuple[str, bool, str | None]]:
    return {
        (r[0], r[1]): (str(r[2]), bool(r[3]), r[4])
        for r in tgt.execute(
            "SELECT schema_name, table_name, state, created, slot FROM applier.table_sync "
            "WHERE origin = %s",
            (origin,),
        ).fetchall()
    }


def _pick(
    tgt: Conn, cfg: Config, plan: Any, rows: dict[Name, Any], patterns: list[str]
) -> list[Any]:
    from ..bootstrap import schema as ddl

    todo = []
    for t in plan.tables:
        name = (t.schema, t.name)
        if patterns and not any(table_matches(p, *name) for p in patterns):
            continue
        row = rows.get(name)
        if row is not None and row[0] in _DONE:
            continue
        if row is None and not ddl.missing_tables(tgt, [name]):
            continue  # on the target already and not ours to copy
        if t.root != name and ddl.missing_tables(tgt, [t.root]):
            # A partition whose root the target lacks: the whole tree is new.
            raise BootstrapRefused(
                f"table {t.qualname} is a partition of {t.root[0]}.{t.root[1]}, which the "
                "target lacks: sync-tables copies plain tables and new partitions of "
                "replicated partitioned tables",
                table=t.qualname,
                hint="copy the tree with `applier bootstrap` (a new bootstrap of the origin)",
            )
        if "." in t.schema:
            raise BootstrapRefused(
                f"schema name {t.schema!r} has a dot: sync-tables cannot copy {t.qualname}",
                table=t.qualname,
                hint="rename the schema, or leave the table out of [tables] / the publication",
            )
        todo.append(t)
    return todo


def _sync_one(
    cfg: Config, src: Conn, tgt: Conn, t: Any, row: tuple[str, bool, str | None] | None,
    spark: Any, truncate: bool, timeout: float, quiet: bool,
) -> None:  # fmt: skip
    from .catchup import catch_up
    from .copy import copy_table

    name = (t.schema, t.name)
    tag = sync_tag(cfg.origin, name)
    tcfg = table_config(cfg, name, tag)
    state = row[0] if row is not None else None
    if state in (None, "skipped"):
        # From here on the worker skips the table's changes (it reads states every 2 s;
        # the copy's snapshot is taken after this commit, so nothing is missed).
        tgt.execute(
            "INSERT INTO applier.table_sync (origin, schema_name, table_name, state, slot) "
            "VALUES (%s, %s, %s, 'init', %s) ON CONFLICT (origin, schema_name, table_name) "
            "DO UPDATE SET state = 'init', slot = excluded.slot, updated_at = now() "
            "WHERE table_sync.state = 'skipped'",
            (cfg.origin, *name, tag),
        )
        state = "init"
    if state in ("init", "copying"):
        created = row is not None and row[1]
        copy_table(cfg, tcfg, src, tgt, t, state, created, truncate, spark, quiet)
    else:
        # The origin is never moved here: its progress, or (none yet, e.g. a crash right
        # after the copy) the slot's confirmed point, which is the snapshot's LSN until
        # an applied transaction moves both, is where the catch-up continues. The row's
        # lsn is no guide: the handshake writes the worker's position into it.
        log.info("resuming the catch-up of a table", extra={"ctx": {"table": t.qualname}})
    catch_up(cfg, tcfg, name, timeout)
    _cleanup(src, tgt, tag)
    tgt.execute(
        "UPDATE applier.table_sync SET slot = NULL WHERE origin = %s AND schema_name = %s "
        "AND table_name = %s",
        (cfg.origin, *name),
    )


def _cleanup(src: Conn, tgt: Conn, tag: str) -> None:
    """What a table's sync leaves: its slot, origin, done-records, status rows."""
    drop_slot(src, tag)
    drop_origin(tgt, tag)
    for table in ("bootstrap_slice",):
        tgt.execute(f"DELETE FROM applier.{table} WHERE slot = %s", (tag,))  # noqa: S608
    for table in ("worker_status", "source_identity"):
        tgt.execute(f"DELETE FROM applier.{table} WHERE origin = %s", (tag,))  # noqa: S608


def cleanup_finished(src: Conn, tgt: Conn, cfg: Config) -> None:
    """A run that died between ``syncdone`` and its cleanup: clean now."""
    for s, n, tag in tgt.execute(
        "SELECT schema_name, table_name, slot FROM applier.table_sync WHERE origin = %s "
        "AND state IN ('syncdone', 'ready') AND slot IS NOT NULL",
        (cfg.origin,),
    ).fetchall():
        _cleanup(src, tgt, tag)
        tgt.execute(
            "UPDATE applier.table_sync SET slot = NULL WHERE origin = %s AND schema_name = %s "
            "AND table_name = %s",
            (cfg.origin, s, n),
        )


def forget_removed(
    src: Conn, tgt: Conn, cfg: Config, rows: dict[Name, Any], published: set[Name]
) -> None:
    """Rows of tables no longer published or included: report, drop their leftovers."""
    quiet = 0
    for name, (state, _created, tag) in sorted(rows.items()):
        if name in published:
            continue
        qual = f"{name[0]}.{name[1]}"
        if state == "ready" and not tag:
            quiet += 1  # a table the target has, not (or no longer) replicated
        else:
            log.warning(
                "table %s is no longer published or included; its sync (%s) is abandoned",
                qual,
                state,
                extra={"ctx": {"table": qual, "state": state}},
            )
            print(f"sync-tables: {qual} is no longer replicated (state {state}): forgotten")
            if state in ("init", "copying", "catchup", "syncwait", "handover") and _created:
                print(f"sync-tables: the target's {qual} (created by sync-tables) holds a "
                      "partial copy; drop it if you do not need it")  # fmt: skip
        if tag:
            _cleanup(src, tgt, tag)
        tgt.execute(
            "DELETE FROM applier.table_sync WHERE origin = %s AND schema_name = %s "
            "AND table_name = %s",
            (cfg.origin, *name),
        )
    if quiet:
        log.info("records of tables no longer replicated removed", extra={"ctx": {"tables": quiet}})
