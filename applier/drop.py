"""``applier drop``: remove what applier created, as ``DROP SUBSCRIPTION`` does.

Three objects, each optional (none named means all three):

* the **slot** on the source (``pg_drop_replication_slot``): the one thing
  that costs the source disk while nobody consumes it;
* the **replication origin** on the target (``pg_replication_origin_drop``):
  the applied position; without it a new ``applier run`` starts afresh (with
  it, the origins of a parallel run's sessions, ``<origin>.<n>``);
* the **applier schema** on the target (``DROP SCHEMA applier CASCADE``):
  applier's own bookkeeping and nothing else: the worker's status row,
  conflict_log, skip rules and the changes they kept, the bootstrap's run,
  table and slice records, the source identity, the stamp tables and their
  trigger functions, alembic's version table. The user's tables are never in
  it; tables a bootstrap created live in their own schemas and stay. The
  schema is per database, not per origin: when it also holds another origin's
  (or another slot's) rows, it stays and only this origin's rows are deleted.

Without ``--yes`` nothing is removed: the plan is printed (what would go,
what is absent already) and the exit code is 0. Absent objects are never an
error, so a drop interrupted half-way is finished by running it again.

Refusals happen before anything is removed (exit 1, nothing removed): a
worker holding the slot (``pg_replication_slots.active``), a worker holding
the origin (probed by taking it with ``pg_replication_origin_session_setup``:
55006 when another session has it; once taken, it is held on a connection of
our own until the removal, so no worker can start meanwhile), or a worker
whose status row is ``running`` with a fresh heartbeat (one between two
sessions holds neither, and would re-create a slot dropped under it). The
schema goes first, in one transaction under a ``lock_timeout``: a session
with applier's tables in an open transaction (a running bootstrap's copy
tasks) makes the drop refuse before the origin and the slot are touched.

An unfinished bootstrap does not stop a drop: abandoning an interrupted one
is a main reason to tear down (``DROP SUBSCRIPTION`` likewise works during a
table sync). The plan names it; the tables it filled stay. A bootstrap
process that still runs must be stopped first: it holds neither the slot nor
the origin while it copies, so drop can only see it through the locks above.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

import psycopg
from psycopg import sql

from applier.apply.parallel.origins import drop_group, group_progress
from applier.apply.target.holder import last_worker

from . import pgconn
from .config import Config
from .errors import PermanentError, TransientError
from .redact import redact_dsn

Conn = psycopg.Connection[Any]

SCHEMA = "applier"
OBJECT_IN_USE = "55006"
LOCK_NOT_AVAILABLE = "55P03"
#: How long the schema's removal waits for a lock before drop refuses.
LOCK_TIMEOUT = "5s"


@dataclass
class Item:
    kind: str  # slot, origin, schema
    label: str  # how the plan names it
    present: bool = False
    detail: str = ""


@dataclass
class Plan:
    items: list[Item] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Why the removal must not happen (a worker holds something).
    refusals: list[str] = field(default_factory=list)
    #: Origins or slots other than ours with rows in the applier schema.
    sharers: list[str] = field(default_factory=list)


def run_drop(
    cfg: Config, *, slot: bool, origin: bool, schema: bool, yes: bool, out: TextIO = sys.stdout
) -> int:
    """Print the plan; with ``yes``, remove it. 0 done (or dry run), 1 refused."""
    want = {k for k, on in (("slot", slot), ("origin", origin), ("schema", schema)) if on}
    want = want or {"slot", "origin", "schema"}
    plan = Plan()
    with _sides(cfg, want, plan) as (src, tgt, hold):
        if "slot" in want:
            assert src is not None
            plan.items.append(_inspect_slot(src, cfg, plan))
        if tgt is not None:
            _check_worker(tgt, hold, cfg, plan)
        if "origin" in want:
            assert tgt is not None
            plan.items.append(_inspect_origin(tgt, cfg))
        if "schema" in want:
            assert tgt is not None
            plan.items.append(_inspect_schema(tgt, cfg, plan))
        _print_plan(plan, out, yes)
        if not yes:
            return 0
        if plan.refusals:
            _refuse(plan.refusals)
        _remove(plan, cfg, src, tgt, hold, out)
    return 0


# -- connections ----------------------------------------------------------------------------


@contextmanager
def _sides(
    cfg: Config, want: set[str], plan: Plan
) -> Iterator[tuple[Conn | None, Conn | None, Conn | None]]:
    """Source (for the slot), target and a second target connection to hold the origin.

    The target is needed for the origin and the schema; for ``--slot`` alone it
    is still asked whether a worker runs, but a target that cannot be reached
    (decommissioned, say) is then only a note.
    """
    conns: list[Conn] = []
    try:
        src = _connect(cfg.source.conninfo(), "source", conns) if "slot" in want else None
        tgt = hold = None
        try:
            tgt = _connect(cfg.target.conninfo(), "target", conns)
            hold = _connect(cfg.target.conninfo(), "target", conns)
        except TransientError as e:
            if want != {"slot"}:
                raise
            plan.notes.append(f"cannot tell whether a worker runs: {e.message}")
        with _errors():
            yield src, tgt, hold
    finally:
        for c in conns:
            c.close()


def _connect(conninfo: str, side: pgconn.Side, conns: list[Conn]) -> Conn:
    try:
        conn = pgconn.connect(conninfo, side=side, purpose="applier drop")
    except psycopg.Error as e:
        raise TransientError(
            f"{side} unreachable ({redact_dsn(conninfo)}): {_first_line(e)}",
            hint=f"check [{side}] dsn and that the server is up; nothing was removed",
        ) from None
    conns.append(conn)
    return conn


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except psycopg.OperationalError as e:
        if e.sqlstate in (OBJECT_IN_USE, LOCK_NOT_AVAILABLE):
            raise TransientError(
                f"applier drop stopped: {_first_line(e)}",
                hint="stop the worker (and any bootstrap), then rerun `applier drop --yes`; "
                "what was removed before this is reported above",
                sqlstate=e.sqlstate,
            ) from None
        raise TransientError(
            f"a server connection failed: {_first_line(e)}",
            hint="rerun `applier drop --yes`: it finishes what is left",
        ) from None
    except psycopg.Error as e:
        raise PermanentError(
            f"a server refused: {_first_line(e)}",
            hint="drop needs the roles applier runs with (REPLICATION on the source; "
            "replication origin functions and ownership of the applier schema on the target)",
            sqlstate=e.sqlstate,
        ) from None


# -- what is there ------------------------------------------------------------------------


def _inspect_slot(src: Conn, cfg: Config, plan: Plan) -> Item:
    name = cfg.source.slot
    item = Item("slot", f"slot {name!r} on the source")
    row = src.execute(
        "SELECT active, active_pid, database, plugin, current_database() "
        "FROM pg_catalog.pg_replication_slots WHERE slot_name = %s",
        (name,),
    ).fetchone()
    if row is None:
        return item
    active, pid, database, plugin, here = row
    if database != here or plugin != "pgoutput":
        # Slot names are cluster-wide: this one is some other database's or tool's.
        plan.refusals.append(
            f"slot {name!r} is not applier's (database {database!r}, plugin {plugin!r}): "
            "drop it by hand if it is to go"
        )
    if active:
        plan.refusals.append(f"a worker holds slot {name!r} (pid {pid} on the source)")
    item.present, item.detail = True, "active" if active else "inactive"
    return item


def _check_worker(tgt: Conn, hold: Conn | None, cfg: Config, plan: Plan) -> None:
    """A worker holding the origin, or running between two sessions: refusals."""
    if hold is not None and _origin_exists(tgt, cfg.origin):
        try:
            hold.execute("SELECT pg_catalog.pg_replication_origin_session_setup(%s)", (cfg.origin,))
        except psycopg.errors.ObjectInUse as e:
            plan.refusals.append(f"a worker holds origin {cfg.origin!r}: {_first_line(e)}")
    if hold is not None:
        _check_members(tgt, cfg, plan)
    if not _exists(tgt, "applier.worker_status"):
        return
    last = last_worker(tgt, cfg.origin)
    if last is not None and last.runs(cfg.apply.status_interval):
        plan.refusals.append(
            f"a worker runs for origin {cfg.origin!r} (pid {last.pid} on {last.host}, "
            f"heartbeat {last.heartbeat_age or 0:.0f} s ago)"
        )


def _check_members(tgt: Conn, cfg: Config, plan: Plan) -> None:
    """A parallel run's session holding its origin (``<origin>.<n>``): a refusal.
    Probed as the origin is, by taking each member and letting it go, on a
    connection of its own (``hold`` keeps the plain origin)."""
    members = list(group_progress(tgt, cfg.origin))
    if not members:
        return
    with pgconn.connect(cfg.target.conninfo(), side="target", purpose="applier drop") as probe:
        for name in members:
            try:
                probe.execute("SELECT pg_catalog.pg_replication_origin_session_setup(%s)", (name,))
            except psycopg.errors.ObjectInUse as e:
                plan.refusals.append(f"a worker holds origin {name!r}: {_first_line(e)}")
                continue
            probe.execute("SELECT pg_catalog.pg_replication_origin_session_reset()")


def _inspect_origin(tgt: Conn, cfg: Config) -> Item:
    item = Item("origin", f"origin {cfg.origin!r} on the target")
    row = tgt.execute(
        "SELECT pg_catalog.pg_replication_origin_progress(roname, false)::text "
        "FROM pg_catalog.pg_replication_origin WHERE roname = %s",
        (cfg.origin,),
    ).fetchone()
    if row is not None:
        item.present, item.detail = True, f"progress {row[0] or 'none'}"
    members = group_progress(tgt, cfg.origin)  # a parallel run's (applier.apply.parallel)
    if members:
        item.present = True
        item.detail = ", ".join(
            filter(None, [item.detail, f"{len(members)} parallel sessions' origins"])
        )
    return item


def _inspect_schema(tgt: Conn, cfg: Config, plan: Plan) -> Item:
    item = Item("schema", f"schema {SCHEMA} on the target")
    if not tgt.execute(
        "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s", (SCHEMA,)
    ).fetchone():
        return item
    item.present = True
    plan.sharers = _sharers(tgt, cfg)
    if plan.sharers:
        item.detail = (
            f"shared with {', '.join(plan.sharers)}: it stays, only origin {cfg.origin!r}'s rows go"
        )
    else:
        item.detail = "worker status, conflict log, skip rules, bootstrap state"
    if _exists(tgt, "applier.bootstrap_run"):
        row = tgt.execute(
            "SELECT phase FROM applier.bootstrap_run WHERE slot = %s AND phase <> 'done'",
            (cfg.source.slot,),
        ).fetchone()
        if row is not None:
            plan.notes.append(
                f"a bootstrap of slot {cfg.source.slot!r} is unfinished (phase {row[0]}): its "
                "records go; the tables it filled stay. Stop it first if it still runs."
            )
    return item


def _keyed_tables(tgt: Conn) -> list[tuple[str, str]]:
    """applier's tables with an origin (else slot) column: (table, that column)."""
    rows = tgt.execute(
        """
        SELECT c.relname, min(a.attname)  -- 'origin' < 'slot': origin when both
          FROM pg_catalog.pg_class c
          JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
          JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid
         WHERE n.nspname = %s AND c.relkind IN ('r', 'p')
           AND a.attname IN ('origin', 'slot') AND NOT a.attisdropped
         GROUP BY c.relname ORDER BY c.relname
        """,
        (SCHEMA,),
    ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def _key(cfg: Config, column: str) -> str:
    return cfg.origin if column == "origin" else cfg.source.slot


def _sharers(tgt: Conn, cfg: Config) -> list[str]:
    found: set[str] = set()
    for table, column in _keyed_tables(tgt):
        query = sql.SQL("SELECT DISTINCT {c} FROM {s}.{t} WHERE {c} <> %s").format(
            c=sql.Identifier(column), s=sql.Identifier(SCHEMA), t=sql.Identifier(table)
        )
        found.update(f"{column} {r[0]!r}" for r in tgt.execute(query, (_key(cfg, column),)))
    return sorted(found)


def _origin_exists(tgt: Conn, origin: str) -> bool:
    return (
        tgt.execute(
            "SELECT 1 FROM pg_catalog.pg_replication_origin WHERE roname = %s", (origin,)
        ).fetchone()
        is not None
    )


def _exists(conn: Conn, relation: str) -> bool:
    row = conn.execute("SELECT pg_catalog.to_regclass(%s) IS NOT NULL", (relation,)).fetchone()
    return bool(row and row[0])


# -- the removal --------------------------------------------------------------------------


def _remove(
    plan: Plan, cfg: Config, src: Conn | None, tgt: Conn | None, hold: Conn | None, out: TextIO
) -> None:
    """Schema first (it can meet locks), then origin, then slot; each one reported."""
    order = {"schema": 0, "origin": 1, "slot": 2}
    for item in sorted(plan.items, key=lambda i: order[i.kind]):
        if not item.present:
            continue
        if item.kind == "schema":
            assert tgt is not None
            _drop_schema(tgt, cfg, plan.sharers)
        elif item.kind == "origin":
            assert tgt is not None and hold is not None
            if _origin_exists(tgt, cfg.origin):
                # Ours until now; a held origin cannot be dropped, even by its holder.
                hold.execute("SELECT pg_catalog.pg_replication_origin_session_reset()")
                tgt.execute("SELECT pg_catalog.pg_replication_origin_drop(%s)", (cfg.origin,))
            drop_group(tgt, cfg.origin)
        else:
            assert src is not None
            src.execute("SELECT pg_catalog.pg_drop_replication_slot(%s)", (cfg.source.slot,))
        what = item.label
        if item.kind == "schema" and plan.sharers:
            what = f"origin {cfg.origin!r}'s rows in {item.label}"
            what += f" (it stays for {', '.join(plan.sharers)})"
        out.write(f"removed {what}\n")
        out.flush()


def _drop_schema(tgt: Conn, cfg: Config, sharers: list[str]) -> None:
    with tgt.transaction():
        tgt.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
        if not sharers:
            tgt.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(SCHEMA)))
            return
        for table, column in _keyed_tables(tgt):
            tgt.execute(
                sql.SQL("DELETE FROM {s}.{t} WHERE {c} = %s").format(
                    s=sql.Identifier(SCHEMA), t=sql.Identifier(table), c=sql.Identifier(column)
                ),
                (_key(cfg, column),),
            )


# -- output ---------------------------------------------------------------------------------


def _print_plan(plan: Plan, out: TextIO, yes: bool) -> None:
    for item in plan.items:
        if not item.present:
            out.write(f"absent: {item.label}\n")
        elif not yes:
            out.write(f"would remove {item.label} ({item.detail})\n")
    for note in plan.notes:
        out.write(f"note: {note}\n")
    if not yes:
        for why in plan.refusals:
            out.write(f"refusal: {why}: `applier drop --yes` would remove nothing now\n")
        if any(i.present for i in plan.items):
            out.write("dry run: nothing removed; rerun with --yes to remove the above\n")
    out.flush()


def _refuse(refusals: list[str]) -> None:
    raise TransientError(
        "; ".join(refusals) + "; nothing removed",
        hint="stop the worker first (systemctl stop, or SIGTERM to `applier run`), then "
        "rerun `applier drop`; a slot that is not applier's: check source.slot",
    )


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
