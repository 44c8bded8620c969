"""``applier status``: what an operator needs to see, answered at any time.

It reads, never writes: the slot on the source (active, holder, confirmed
position, WAL retained), the replication origin's progress on the target, the
worker's row in ``applier.worker_status`` (state, heartbeat, counters, the
last error it stopped on), the conflicts recorded in ``applier.conflict_log``
counted per table, type and resolution, and the number of active skip rules,
and derives lag in bytes and seconds. When the worker stopped on an error
that names its transaction's finish LSN, status prints the exact
``applier skip add --config F --lsn LSN`` that skips that transaction (or the
id of the rule that does, once it exists). Each side is
queried on its own short connection, so a down server shows up as an error
for that side while the other side is still reported. The slot's
``failover`` flag (PostgreSQL 17+) is shown; null on older servers.

The exit code is a health verdict (:mod:`applier.health`): 0 healthy, 1 a
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
from psycopg.rows import dict_row

from .config import Config
from .errors import ApplierError
from .health import assess
from .lsn import Lsn
from .redact import redact_dsn
from .refusal import raise_refusal

SLOT_SQL = """
SELECT s.slot_name, s.plugin, s.active, s.active_pid, s.wal_status,
       s.confirmed_flush_lsn::text AS confirmed_flush_lsn, s.safe_wal_size,
       -- PostgreSQL 17+ only: read through to_jsonb so that older servers give NULL.
       (to_jsonb(s) ->> 'failover')::boolean AS failover,
       to_jsonb(s) ->> 'invalidation_reason' AS invalidation_reason,
       s.restart_lsn::text AS restart_lsn,
       pg_current_wal_lsn()::text AS current_wal_lsn,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint AS retained_bytes,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint AS lag_bytes,
       r.application_name, r.client_addr::text AS client_addr,
       extract(epoch FROM r.replay_lag)::float8 AS replay_lag_s,
       r.reply_time
FROM pg_replication_slots s
LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
WHERE s.slot_name = %s
"""

ORIGIN_SQL = """
SELECT o.roident, pg_replication_origin_progress(o.roname, false)::text AS remote_lsn,
       s.local_lsn::text AS local_lsn
FROM pg_replication_origin o
LEFT JOIN pg_replication_origin_status s ON s.local_id = o.roident
WHERE o.roname = %s
"""

WORKER_SQL = """
SELECT state, pid, host, started_at, heartbeat_at,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_s,
       applied_txns, skipped_changes,
       last_commit_lsn::text AS last_commit_lsn, last_commit_time, last_error, last_error_at
FROM applier.worker_status WHERE origin = %s
"""

CONFLICTS_SQL = """
SELECT schema_name || '.' || table_name AS table, conflict, resolution,
       count(*) AS count, max(logged_at) AS last_at
  FROM applier.conflict_log WHERE origin = %s
 GROUP BY schema_name, table_name, conflict, resolution
 ORDER BY schema_name, table_name, conflict, resolution
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
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    active_skip_rules: int | None = None
    #: The command that skips the transaction the worker stopped on, if known.
    skip_command: str | None = None
    #: The transaction rule that skips it, once one was added.
    skip_rule: int | None = None
    errors: list[str] = field(default_factory=list)
    source_reachable: bool = True
    target_reachable: bool = True
    #: The verdict (applier.health): the exit code, its name, why, what to do.
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
    _derive_lag(st)
    verdict = assess(st, cfg)
    st.code, st.health, st.reason, st.hint = (
        verdict.code,
        verdict.health,
        verdict.reason,
        verdict.hint,
    )
    return st


def _connect(conninfo: str, side: str) -> psycopg.Connection[Any]:
    """A refused connection is bad configuration (exit 2), not "unreachable" (1)."""
    with raise_refusal(side, conninfo):
        return psycopg.connect(conninfo, connect_timeout=5, autocommit=True)


def _query(conninfo: str, sql: str, arg: str, side: str) -> dict[str, Any] | None:
    with _connect(conninfo, side) as conn:
        return conn.cursor(row_factory=dict_row).execute(sql, (arg,)).fetchone()


def _source_side(cfg: Config, st: Status) -> None:
    try:
        st.slot = _query(cfg.source.conninfo(), SLOT_SQL, cfg.source.slot, "source")
    except psycopg.Error as e:
        st.source_reachable = False
        st.errors.append(f"source unreachable ({redact_dsn(cfg.source.dsn)}): {_first_line(e)}")
        return
    if st.slot is None:
        st.errors.append(
            f"slot {cfg.source.slot!r} does not exist on the source "
            "(applier bootstrap creates it; applier run only for an origin without progress)"
        )


def _target_side(cfg: Config, st: Status) -> None:
    conninfo = cfg.target.conninfo()
    try:
        st.origin_progress = _query(conninfo, ORIGIN_SQL, cfg.origin, "target")
        with _connect(conninfo, "target") as conn:
            has_schema = conn.execute("SELECT to_regclass('applier.worker_status')").fetchone()
            if has_schema and has_schema[0] is not None:
                st.worker = (
                    conn.cursor(row_factory=dict_row).execute(WORKER_SQL, (cfg.origin,)).fetchone()
                )
            _conflicts_and_skips(conn, cfg, st)
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


def _derive_lag(st: Status) -> None:
    if st.slot is None:
        return
    st.lag_bytes = st.slot.get("lag_bytes")
    if st.slot.get("replay_lag_s") is not None:
        st.lag_seconds = float(st.slot["replay_lag_s"])
    elif st.lag_bytes == 0:
        st.lag_seconds = 0.0
    elif st.worker and st.worker.get("last_commit_time"):
        # No live feedback: the age of the last applied source commit.
        now = dt.datetime.now(dt.UTC)
        st.lag_seconds = (now - st.worker["last_commit_time"]).total_seconds()


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
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"applier: slot {st.slot_name} -> origin {st.origin}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    s, o, w = st.slot or {}, st.origin_progress or {}, st.worker or {}
    rows: list[tuple[str, Any]] = [
        ("source", st.source),
        ("target", st.target),
        ("slot active", f"{s.get('active')} (pid {s.get('active_pid')})" if s else "-"),
        ("slot confirmed", s.get("confirmed_flush_lsn")),
        ("slot wal_status", s.get("wal_status")),
        ("slot failover", _failover(s)),
        ("source WAL now", s.get("current_wal_lsn")),
        ("WAL retained", _bytes(s.get("retained_bytes"))),
        ("origin progress", o.get("remote_lsn")),
        ("lag", f"{_bytes(st.lag_bytes)}, {_secs(st.lag_seconds)}"),
        ("worker", f"{w.get('state')} pid {w.get('pid')} on {w.get('host')}" if w else "-"),
        ("worker heartbeat", w.get("heartbeat_at")),
        ("applied txns", w.get("applied_txns")),
        ("skipped changes", w.get("skipped_changes")),
        ("last error", json.dumps(_jsonable(w["last_error"])) if w.get("last_error") else "-"),
        ("active skip rules", st.active_skip_rules),
        ("conflicts", sum(c["count"] for c in st.conflicts)),
    ]
    for k, v in rows:
        table.add_row(k, "-" if v is None else str(v))
    console = Console(file=out, width=120)
    console.print(table)
    if st.conflicts:
        console.print(_conflict_table(st.conflicts))
    _skip_hint(st, out)
    for err in st.errors:
        console.print(f"[yellow]note:[/] {err}", markup=True)
    _verdict(st, out)


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


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.1f} TB"


def _secs(s: float | None) -> str:
    return "-" if s is None else f"{s:.1f} s"


def show_status(cfg: Config, *, as_json: bool, out: TextIO = sys.stdout) -> int:
    """Print the status; return its health code (see :mod:`applier.health`)."""
    st = collect(cfg)
    (render_json if as_json else render_text)(st, out)
    assert st.code is not None
    return st.code
