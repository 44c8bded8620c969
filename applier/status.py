"""``applier status``: what an operator needs to see, answered at any time.

It reads, never writes: the slot on the source (active, holder, confirmed
position, WAL retained), the replication origin's progress on the target, the
worker's row in ``applier.worker_status`` (state, heartbeat, counters, the
last error it stopped on) and derives lag in bytes and seconds. Each side is
queried on its own short connection, so a down server shows up as an error
for that side while the other side is still reported.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import psycopg
from psycopg.rows import dict_row

from .config import Config, redact_dsn

SLOT_SQL = """
SELECT s.slot_name, s.plugin, s.active, s.active_pid, s.wal_status,
       s.confirmed_flush_lsn::text AS confirmed_flush_lsn,
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
SELECT state, pid, host, started_at, heartbeat_at, applied_txns, skipped_changes,
       last_commit_lsn::text AS last_commit_lsn, last_commit_time, last_error, last_error_at
FROM applier.worker_status WHERE origin = %s
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
    errors: list[str] = field(default_factory=list)

    @property
    def worker_holds_slot(self) -> bool:
        return bool(self.slot and self.slot.get("active"))


def collect(cfg: Config) -> Status:
    st = Status(
        slot_name=cfg.source.slot,
        origin=cfg.origin,
        source=cfg.source.redacted,
        target=cfg.target.redacted,
    )
    _source_side(cfg, st)
    _target_side(cfg, st)
    _derive_lag(st)
    return st


def _query(conninfo: str, sql: str, arg: str) -> dict[str, Any] | None:
    with psycopg.connect(conninfo, connect_timeout=5, autocommit=True) as conn:
        return conn.cursor(row_factory=dict_row).execute(sql, (arg,)).fetchone()


def _source_side(cfg: Config, st: Status) -> None:
    try:
        st.slot = _query(cfg.source.conninfo(), SLOT_SQL, cfg.source.slot)
    except psycopg.Error as e:
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
        st.origin_progress = _query(conninfo, ORIGIN_SQL, cfg.origin)
        with psycopg.connect(conninfo, connect_timeout=5, autocommit=True) as conn:
            has_schema = conn.execute("SELECT to_regclass('applier.worker_status')").fetchone()
            if has_schema and has_schema[0] is not None:
                st.worker = (
                    conn.cursor(row_factory=dict_row).execute(WORKER_SQL, (cfg.origin,)).fetchone()
                )
    except psycopg.Error as e:
        st.errors.append(f"target unreachable ({redact_dsn(cfg.target.dsn)}): {_first_line(e)}")
        return
    if st.origin_progress is None:
        st.errors.append(f"replication origin {cfg.origin!r} does not exist on the target yet")


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
        ("source WAL now", s.get("current_wal_lsn")),
        ("WAL retained", _bytes(s.get("retained_bytes"))),
        ("origin progress", o.get("remote_lsn")),
        ("lag", f"{_bytes(st.lag_bytes)}, {_secs(st.lag_seconds)}"),
        ("worker", f"{w.get('state')} pid {w.get('pid')} on {w.get('host')}" if w else "-"),
        ("worker heartbeat", w.get("heartbeat_at")),
        ("applied txns", w.get("applied_txns")),
        ("skipped changes", w.get("skipped_changes")),
        ("last error", json.dumps(_jsonable(w["last_error"])) if w.get("last_error") else "-"),
    ]
    for k, v in rows:
        table.add_row(k, "-" if v is None else str(v))
    console = Console(file=out, width=120)
    console.print(table)
    for err in st.errors:
        console.print(f"[yellow]note:[/] {err}", markup=True)


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
    st = collect(cfg)
    (render_json if as_json else render_text)(st, out)
    unreachable = any("unreachable" in e for e in st.errors)
    return 1 if unreachable else 0
