"""``applier status``: what an operator needs to see, answered at any time.

It reads, never writes: the slot on the source (active, holder, confirmed
position, WAL retained), whether the source has applier's DDL capture
(:mod:`applier.ddl.capture`: installed, its version, enabled), the
replication origin's progress on the target, the
worker's row in ``applier.worker_status`` (state, heartbeat, counters, the
last error it stopped on), the conflicts recorded in ``applier.conflict_log``
counted per table, type and resolution, and the number of active skip rules,
and derives lag in bytes and seconds as :mod:`applier.lag` defines it: bytes
from the source's current WAL position to the higher of the origin's progress
and the slot's confirmed position; seconds from the row's ``pending_since``
(the running worker's report, at most ``[apply] status_interval`` old) to the
source's clock, 0 when nothing is pending or nothing is left in bytes. For a
worker that is not running (no row, stopped, failed, or its report older than
three status intervals) the seconds are not known and the JSON's
``lag_note`` says so. When the worker stopped on an error
that names its transaction's finish LSN, status prints the exact
``applier skip add --config F --lsn LSN`` that skips that transaction (or the
id of the rule that does, once it exists). Each side is
queried on its own short connection, so a down server shows up as an error
for that side while the other side is still reported. The slot's
``failover`` flag (PostgreSQL 17+) is shown; null on older servers.

The exit code is a health verdict (:mod:`applier.status.health`): 0 healthy, 1 a
server unreachable, 3 the worker stopped on an error, 4 no worker running or
its heartbeat stale, 5 the slot missing, invalidated or retaining more WAL
than ``[status] max_retained_wal``; ``--json`` carries it as ``code`` with
``health``, ``reason`` and ``hint``.
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from .. import pgconn
from ..config import Config
from ..ddl import capture
from ..errors import ApplierError, describe_error_record
from ..lag import SOURCE_WAL_LSN, Lag, format_bytes, measure, not_running
from ..lsn import Lsn
from ..origingroup import progress_sql
from ..redact import redact_dsn
from .health import STALE_INTERVALS, assess

SLOT_SQL = sql.SQL("""
SELECT s.slot_name, s.plugin, s.active, s.active_pid,
       -- Columns newer than PostgreSQL 10 are read through to_jsonb, so that older
       -- servers give NULL: wal_status and safe_wal_size (13), reply_time (12),
       -- failover and invalidation_reason (17).
       to_jsonb(s) ->> 'wal_status' AS wal_status,
       s.confirmed_flush_lsn::text AS confirmed_flush_lsn,
       (to_jsonb(s) ->> 'safe_wal_size')::bigint AS safe_wal_size,
       (to_jsonb(s) ->> 'failover')::boolean AS failover,
       to_jsonb(s) ->> 'invalidation_reason' AS invalidation_reason,
       s.restart_lsn::text AS restart_lsn,
       w.lsn::text AS current_wal_lsn,
       pg_wal_lsn_diff(w.lsn, s.restart_lsn)::bigint AS retained_bytes,
       r.application_name, r.client_addr::text AS client_addr,
       (to_jsonb(r) ->> 'reply_time')::timestamptz AS reply_time,
       pg_catalog.clock_timestamp() AS source_now
FROM (SELECT {source_wal} AS lsn) w
CROSS JOIN pg_replication_slots s
LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
WHERE s.slot_name = %s
""").format(source_wal=SOURCE_WAL_LSN)

# The progress is the restart point: the largest of the origin's and its parallel
# group's (members '<origin>.<n>', applier.origingroup).
ORIGIN_SQL = (
    "SELECT o.roident, "
    + progress_sql("o.roname", flushed=False)
    + """::text AS remote_lsn, s.local_lsn::text AS local_lsn
FROM pg_replication_origin o
LEFT JOIN pg_replication_origin_status s ON s.local_id = o.roident
WHERE o.roname = %s
"""
)

WORKER_SQL = """
SELECT state, pid, host, started_at, heartbeat_at,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_s,
       applied_txns, skipped_changes,
       last_commit_lsn::text AS last_commit_lsn, last_commit_time, last_error, last_error_at,
       -- 0010+: read through to_jsonb, so that a schema not upgraded yet gives NULL.
       (to_jsonb(w) ->> 'pending_since')::timestamptz AS pending_since,
       extract(epoch FROM now() - (to_jsonb(w) ->> 'lag_at')::timestamptz)::float8 AS lag_age_s,
       to_jsonb(w) -> 'parallel' AS parallel  -- 0013+
FROM applier.worker_status w WHERE origin = %s
"""

CONFLICTS_SQL = """
SELECT schema_name || '.' || table_name AS table, conflict, resolution,
       count(*) AS count, max(logged_at) AS last_at
  FROM applier.conflict_log WHERE origin = %s
 GROUP BY schema_name, table_name, conflict, resolution
 ORDER BY schema_name, table_name, conflict, resolution
"""

#: Tables whose changes the worker holds for sync-tables (applier.synctables).
HELD_TABLES_SQL = """
SELECT schema_name || '.' || table_name AS table, state, lsn::text AS lsn
  FROM applier.table_sync WHERE origin = %s AND state NOT IN ('syncdone', 'ready')
 ORDER BY schema_name, table_name
"""

ACTIVE_RULES_SQL = "SELECT count(*) FROM applier.skip_rules WHERE origin = %s AND NOT done"

RULE_FOR_LSN_SQL = """
SELECT id FROM applier.skip_rules
 WHERE origin = %s AND kind = 'txn' AND lsn = %s::pg_lsn ORDER BY done, id LIMIT 1
"""


@dataclass
class Status:
    slot_name: str
    origin: str
    source: str
    target: str
    slot: dict[str, Any] | None = None
    origin_progress: dict[str, Any] | None = None
    worker: dict[str, Any] | None = None
    lag_bytes: int | None = None
    lag_seconds: float | None = None
    #: Why ``lag_seconds`` is None (no worker running to measure it).
    lag_note: str | None = None
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    active_skip_rules: int | None = None
    #: Tables held for sync-tables: table, state, lsn (HELD_TABLES_SQL).
    held_tables: list[dict[str, Any]] = field(default_factory=list)
    #: The command that skips the transaction the worker stopped on, if known.
    skip_command: str | None = None
    #: The transaction rule that skips it, once one was added.
    skip_rule: int | None = None
    #: The source's DDL capture (applier.ddl.capture.State.as_dict), None if unread.
    ddl_capture: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    source_reachable: bool = True
    target_reachable: bool = True
    #: The verdict (applier.status.health): the exit code, its name, why, what to do.
    code: int | None = None
    health: str | None = None
    reason: str | None = None
    hint: str | None = None

    @property
    def worker_holds_slot(self) -> bool:
        return bool(self.slot and self.slot.get("active"))


def collect(cfg: Config) -> Status:
    """Everything ``applier status`` shows; a side that is down becomes a note."""
    st = Status(
        slot_name=cfg.source.slot,
        origin=cfg.origin,
        source=cfg.source.redacted,
        target=cfg.target.redacted,
    )
    _source_side(cfg, st)
    _target_side(cfg, st)
    _derive_lag(st, cfg)
    verdict = assess(st, cfg)
    st.code, st.health, st.reason, st.hint = (
        verdict.code,
        verdict.health,
        verdict.reason,
        verdict.hint,
    )
    return st


def _connect(conninfo: str, side: pgconn.Side) -> psycopg.Connection[Any]:
    return pgconn.connect(conninfo, side=side, purpose="applier status", connect_timeout=5)


def _query(
    conninfo: str, side: pgconn.Side, query: str | sql.Composed, arg: str
) -> dict[str, Any] | None:
    with _connect(conninfo, side) as conn:
        return conn.cursor(row_factory=dict_row).execute(query, (arg,)).fetchone()


def _source_side(cfg: Config, st: Status) -> None:
    try:
        with _connect(cfg.source.conninfo(), "source") as conn:
            cur = conn.cursor(row_factory=dict_row)
            st.slot = cur.execute(SLOT_SQL, (cfg.source.slot,)).fetchone()
            st.ddl_capture = _ddl_capture(conn)
    except psycopg.Error as e:
        st.source_reachable = False
        st.errors.append(f"source unreachable ({redact_dsn(cfg.source.dsn)}): {_first_line(e)}")
        return
    if st.slot is None:
        st.errors.append(
            f"slot {cfg.source.slot!r} does not exist on the source "
            "(applier bootstrap creates it; applier run only for an origin without progress)"
        )


def _ddl_capture(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """The capture's state; one the role cannot read (USAGE on ``applier_ddl`` revoked)
    is said so, not taken for the source being down."""
    try:
        return capture.state(conn).as_dict()
    except psycopg.Error as e:
        if conn.closed or isinstance(e, psycopg.OperationalError):
            raise
        return {"installed": None, "summary": f"not known: {_first_line(e)}"}


def _target_side(cfg: Config, st: Status) -> None:
    conninfo = cfg.target.conninfo()
    try:
        st.origin_progress = _query(conninfo, "target", ORIGIN_SQL, cfg.origin)
        with _connect(conninfo, "target") as conn:
            has_schema = conn.execute(
                "SELECT pg_catalog.to_regclass('applier.worker_status')"
            ).fetchone()
            if has_schema and has_schema[0] is not None:
                st.worker = (
                    conn.cursor(row_factory=dict_row).execute(WORKER_SQL, (cfg.origin,)).fetchone()
                )
            _conflicts_and_skips(conn, cfg, st)
            st.held_tables = _held(conn, cfg)
    except psycopg.Error as e:
        st.target_reachable = False
        st.errors.append(f"target unreachable ({redact_dsn(cfg.target.dsn)}): {_first_line(e)}")
        return
    if st.origin_progress is None:
        st.errors.append(f"replication origin {cfg.origin!r} does not exist on the target yet")


def _conflicts_and_skips(conn: psycopg.Connection[Any], cfg: Config, st: Status) -> None:
    row = conn.execute("SELECT pg_catalog.to_regclass('applier.skip_rules')").fetchone()
    if not row or row[0] is None:  # the schema is older than migration 0006
        return
    st.conflicts = (
        conn.cursor(row_factory=dict_row).execute(CONFLICTS_SQL, (cfg.origin,)).fetchall()
    )
    active = conn.execute(ACTIVE_RULES_SQL, (cfg.origin,)).fetchone()
    st.active_skip_rules = int(active[0]) if active else 0
    lsn = _failed_finish_lsn(st.worker)
    if lsn is None:
        return
    rule = conn.execute(RULE_FOR_LSN_SQL, (cfg.origin, str(lsn))).fetchone()
    if rule is not None:
        st.skip_rule = int(rule[0])
    config = shlex.quote(str(cfg.path)) if cfg.path is not None else "F"
    st.skip_command = f"applier skip add --config {config} --lsn {lsn}"


def _failed_finish_lsn(worker: dict[str, Any] | None) -> Lsn | None:
    """The finish LSN of the transaction the worker stopped on (state ``error``)."""
    if not worker or worker.get("state") != "error":
        return None
    error = worker.get("last_error")
    context = error.get("context") if isinstance(error, dict) else None
    finish = context.get("finish_lsn") if isinstance(context, dict) else None
    if not isinstance(finish, str):
        return None
    try:
        return Lsn.parse(finish)
    except ApplierError:
        return None


def _derive_lag(st: Status, cfg: Config) -> None:
    """The lag (applier.lag) from the source's position, the origin and the slot, and
    the running worker's report of what it holds."""
    if st.slot is None:
        return
    source_now = st.slot.pop("source_now", None)
    source = _lsn(st.slot.get("current_wal_lsn"))
    done_at = [
        lsn
        for lsn in (
            _lsn((st.origin_progress or {}).get("remote_lsn")),
            _lsn(st.slot.get("confirmed_flush_lsn")),
        )
        if lsn is not None
    ]
    done = max(done_at) if done_at else None
    if _worker_reports(st.worker, cfg) and source_now is not None:
        assert st.worker is not None
        lag = measure(source, done, st.worker.get("pending_since"), source_now)
    else:
        lag = not_running(source, done)
    st.lag_bytes, st.lag_seconds, st.lag_note = lag.bytes, lag.seconds, lag.note


def _worker_reports(worker: dict[str, Any] | None, cfg: Config) -> bool:
    """A worker runs and its reporter wrote the lag lately (the apply loop may be blocked:
    the reporter is a thread of its own, see applier.apply.beat)."""
    if not worker or worker.get("state") != "running":
        return False
    age = worker.get("lag_age_s")
    return age is not None and age <= STALE_INTERVALS * cfg.apply.status_interval


def _lsn(text: str | None) -> Lsn | None:
    return None if text is None else Lsn.parse(text)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _jsonable(v: Any) -> Any:
    if isinstance(v, dt.datetime):
        return v.isoformat()
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    return v


def render_json(st: Status, out: TextIO) -> None:
    obj = _jsonable(asdict(st))
    obj["worker_holds_slot"] = st.worker_holds_slot
    json.dump(obj, out, indent=2, sort_keys=True)
    out.write("\n")


def render_text(st: Status, out: TextIO) -> None:
    from rich.table import Table

    from ..console import console as make_console

    table = Table(title=f"applier: slot {st.slot_name} -> origin {st.origin}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    s, o, w = st.slot or {}, st.origin_progress or {}, st.worker or {}
    rows: list[tuple[str, Any]] = [
        ("source", st.source),
        ("target", st.target),
        ("slot active", _slot_holder(s) if s else "-"),
        ("slot confirmed", s.get("confirmed_flush_lsn")),
        ("slot wal_status", s.get("wal_status")),
        ("slot failover", _failover(s)),
        ("source WAL now", s.get("current_wal_lsn")),
        ("WAL retained", format_bytes(s.get("retained_bytes"))),
        ("origin progress", o.get("remote_lsn")),
        ("lag", Lag(st.lag_bytes, st.lag_seconds, st.lag_note).describe()),
        ("worker", f"{w.get('state')} pid {w.get('pid')} on {w.get('host')}" if w else "-"),
        ("worker heartbeat", w.get("heartbeat_at")),
        ("applied txns", w.get("applied_txns")),
        ("parallel apply", _parallel(w.get("parallel"))),
        ("skipped changes", w.get("skipped_changes")),
        ("last error", _last_error_at(w)),
        ("active skip rules", st.active_skip_rules),
        ("conflicts", sum(c["count"] for c in st.conflicts)),
        ("ddl capture", (st.ddl_capture or {}).get("summary")),
    ]
    for k, v in rows:
        table.add_row(k, "-" if v is None else str(v))
    console = make_console(out)
    console.print(table)
    if st.conflicts:
        console.print(_conflict_table(st.conflicts))
    _held_tables(st, out)
    _last_error(st, out)
    _skip_hint(st, out)
    for err in st.errors:
        console.print(f"[yellow]note:[/] {err}", markup=True)
    _verdict(st, out)


def _parallel(p: dict[str, int] | None) -> str | None:
    """The pool's line (``[apply] workers`` > 1), as of the worker's last heartbeat."""
    if not p:
        return None
    return (
        f"{p['sessions']} sessions, {p['in_flight']} transactions in flight "
        f"({p['waiting']} waiting); serialised by a key {p['serialised_by_key']}, "
        f"by a barrier {p['serialised_by_barrier']}; deadlocks resolved {p['deadlocks']}, "
        f"applied again {p['retried']}; {_lane(p)}"
    )


def _lane(p: dict[str, int]) -> str:
    """Where ordinary transactions go now (applier.apply.parallel.lanes)."""
    where = (
        "the leader's own session (applier's CPU is the limit)" if p.get("inline") else "the pool"
    )
    return f"transactions go to {where}, lane switches {p.get('lane_switches', 0)}"


def _held(conn: psycopg.Connection[Any], cfg: Config) -> list[dict[str, Any]]:
    """The tables held for sync-tables, each with what it waits for (``says``)."""
    row = conn.execute("SELECT pg_catalog.to_regclass('applier.table_sync')").fetchone()
    if not row or row[0] is None:
        return []
    rows = conn.cursor(row_factory=dict_row).execute(HELD_TABLES_SQL, (cfg.origin,)).fetchall()
    config = shlex.quote(str(cfg.path)) if cfg.path is not None else "F"
    for t in rows:
        if t["state"] != "skipped":
            t["says"] = f"sync-tables {t['state']}"
        elif t["lsn"] is not None:  # held by the worker for its own fill (handlers/tablefill)
            t["says"] = (
                f"waiting for sync-tables (added to the publication at {t['lsn']}; "
                "the worker starts it, and again after a failure)"
            )
        else:
            t["says"] = f"never copied: applier sync-tables --config {config} --tables {t['table']}"
    return rows


def _held_tables(st: Status, out: TextIO) -> None:
    # Plain lines: each may carry a command to copy.
    if not st.held_tables:
        return
    out.flush()
    out.write("tables held for sync-tables:\n")
    for t in st.held_tables:
        out.write(f"  {t['table']}: {t['says']}\n")


def _slot_holder(slot: dict[str, Any]) -> str:
    if not slot.get("active"):
        return "no"
    return f"yes (pid {slot.get('active_pid')})"


def _last_error_at(worker: dict[str, Any]) -> str:
    if not worker.get("last_error"):
        return "-"
    at = worker.get("last_error_at")
    return f"{at.isoformat(timespec='seconds')} (below)" if at else "(below)"


def _last_error(st: Status, out: TextIO) -> None:
    # A plain line, not a table cell: a cell that long would widen every row
    # of the table, or wrap the error into pieces.
    w = st.worker or {}
    if not w.get("last_error"):
        return
    out.flush()
    # The skip command has lines of its own, whole.
    line = describe_error_record(w["last_error"], leave_out=("skip_command",))
    out.write(f"last error: {line}\n")


def _failover(slot: dict[str, Any]) -> str | None:
    if not slot:
        return None
    flag = slot.get("failover")
    return "- (PostgreSQL < 17)" if flag is None else str(flag)


def _verdict(st: Status, out: TextIO) -> None:
    # Plain lines: the reason and the hint may hold commands to copy.
    out.flush()
    out.write(f"health: {st.health} (exit {st.code}): {st.reason}\n")
    if st.hint:
        out.write(f"what to do: {st.hint}\n")


def _conflict_table(conflicts: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="conflicts")
    for col in ("table", "conflict", "resolution", "count", "last"):
        table.add_column(col, justify="right" if col == "count" else "left")
    for c in conflicts:
        last = c["last_at"].isoformat(timespec="seconds") if c["last_at"] else "-"
        table.add_row(c["table"], c["conflict"], c["resolution"], str(c["count"]), last)
    return table


def _skip_hint(st: Status, out: TextIO) -> None:
    # Plain lines, not table cells: the command must stay whole to be copied.
    if st.skip_command is None:
        return
    out.flush()
    if st.skip_rule is not None:
        out.write(
            f"skip rule {st.skip_rule} skips the transaction the worker stopped on: "
            "start the worker\n"
        )
    else:
        out.write(f"to skip the transaction the worker stopped on:\n  {st.skip_command}\n")


def show_status(cfg: Config, *, as_json: bool, out: TextIO = sys.stdout) -> int:
    """Print the status; return its health code (see :mod:`applier.status.health`)."""
    st = collect(cfg)
    (render_json if as_json else render_text)(st, out)
    assert st.code is not None
    return st.code
