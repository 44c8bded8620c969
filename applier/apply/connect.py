"""One apply session's connections, as the worker opens them (:mod:`.worker`, "Overview").

* :func:`open_status` - before any session: the status row's connection, the
  target role's grants checked and the applier schema migrated;
* :func:`take_origin` - the apply session on the target, owning the replication
  origin (refused, or waited for, when someone holds it: :mod:`.target.holder`);
* :func:`our_origin` - what the conflict policies need of the target, and our
  origin's id (the origin of the rows we wrote, in their commit timestamps);
* :func:`new_stream` - the replication connection, checked
  (:mod:`.target.preflight`) and made into the logical stream from the
  origin's progress; the worker starts it.

The retries around them are :mod:`.backoff`'s; the loop they feed is the worker's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import psycopg

from applier.apply.target.connection import client_keepalives
from applier.apply.target.holder import OBJECT_IN_USE, origin_taken
from applier.apply.target.preflight import check_before_streaming
from applier.apply.target.session import TargetSession, connect
from applier.config import Config
from applier.errors import ConfigError, ConnectionLost
from applier.lsn import Lsn
from applier.privileges import Scope
from applier.privileges import check as check_privileges
from applier.redact import redact_dsn
from applier.schema import schema_at_head, upgrade_target
from applier.status.health import STALE_INTERVALS
from applier.status.row import WorkerState

if TYPE_CHECKING:
    from applier.stream.client import LogicalStream

log = logging.getLogger("applier.apply")


def source_conninfo(cfg: Config) -> str:
    """The source DSN with keepalives and tcp_user_timeout (unless the DSN sets them:
    see targetconn); the session settings that make text values portable come with
    every connection (applier.pgconn)."""
    return client_keepalives(cfg.source.conninfo(), cfg.apply.timeout)


def open_status(cfg: Config) -> WorkerState:
    """The worker's status row (its own connection), once the target role's grants
    are checked and the applier schema is at head."""
    target_ci = cfg.target.conninfo()
    timeout = cfg.apply.target_timeout
    status_conn = connect(target_ci, "applier status", timeout)
    # Before the migrations or the slot: every grant the target role lacks, in one line.
    check_privileges("run", Scope(), target=status_conn)
    if not schema_at_head(status_conn):
        upgrade_target(target_ci)
    # Reopened on the next write after it broke (a target restart, a terminated
    # backend): the row must keep showing a fresh heartbeat and the last error.
    # The row is written once the first session owns the origin (state.py,
    # "Whose row"): a second worker must not take over the running one's row.
    return WorkerState(
        status_conn,
        cfg.origin,
        cfg.source.slot,
        reopen=lambda: connect(target_ci, "applier status", timeout),
    )


def take_origin(cfg: Config, catalog_conn: psycopg.Connection[Any]) -> TargetSession:
    """The apply session, owning the origin; refused at once when another worker
    holds it, a wait when an abandoned backend does (applier.apply.target.holder)."""
    try:
        return TargetSession(
            cfg.target.conninfo(),
            cfg.origin,
            cfg.apply.synchronous_commit,
            cfg.apply.copy_threshold,
            cfg.apply.target_timeout,
        )
    except ConnectionLost as e:
        if e.context.get("sqlstate") != OBJECT_IN_USE:
            raise
        stale_after = STALE_INTERVALS * cfg.apply.status_interval
        raise origin_taken(catalog_conn, cfg.origin, e, stale_after) from None


def our_origin(cfg: Config, catalog_conn: psycopg.Connection[Any]) -> int | None:
    """Check what the conflict policies need of the target; our origin's id (its
    rows' origin in commit timestamps)."""
    if cfg.conflicts.needs_commit_ts:
        row = catalog_conn.execute("SHOW track_commit_timestamp").fetchone()
        if not row or row[0] != "on":
            raise ConfigError(
                "[conflicts] uses last_update_wins or an *_origin_differs policy, which "
                "need the commit timestamps of the target's rows, and the target has "
                "track_commit_timestamp = off",
                hint="set track_commit_timestamp = on on the target (a restart of the "
                "target is needed), or remove those policies, and start applier run again",
            )
    row = catalog_conn.execute(
        "SELECT roident FROM pg_catalog.pg_replication_origin WHERE roname = %s",
        (cfg.origin,),
    ).fetchone()
    return None if row is None else int(row[0])


def new_stream(cfg: Config, catalog_conn: psycopg.Connection[Any], progress: Lsn) -> LogicalStream:
    """The logical stream from ``progress``, its replication connection checked first
    (closed if a check fails); not started."""
    from applier.stream.client import LogicalStream, StreamOptions
    from applier.stream.replconn import ReplicationConnection

    repl = ReplicationConnection.open(source_conninfo(cfg), application_name="applier")
    try:
        check_before_streaming(catalog_conn, repl, cfg, progress)
    except BaseException:
        repl.close()
        raise
    stream = LogicalStream(
        repl,
        StreamOptions(
            slot=cfg.source.slot,
            publications=tuple(cfg.source.publications),
            start_lsn=progress,
            binary=cfg.apply.binary,
            messages=True,
            streaming=cfg.apply.streaming,
            two_phase=cfg.apply.two_phase,
            origin=cfg.source.origin,  # 16+: the walsender filters (originfilter)
            status_interval=cfg.apply.status_interval,
            timeout=cfg.apply.timeout,
            defer_streamed=True,
            group_streamed=True,  # Applier.on_streamed_run, on_insert_run
        ),
    )
    log.info(
        "connected",
        extra={"ctx": {"source": redact_dsn(cfg.source.dsn), "target": cfg.target.redacted}},
    )
    return stream
