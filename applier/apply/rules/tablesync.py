"""The worker's half of ``applier sync-tables``: which tables' changes to hold back.

The protocol, and why each step is safe, is in :mod:`applier.synctables`. Here:

* :attr:`TableSyncs.cut` maps a source relation OID to a *cut* LSN: a change of
  that table in a transaction whose commit record starts before the cut
  (``commit_lsn < cut`` <=> the transaction ends at or before it) is skipped;
  ``INF`` skips them all (the table is being copied, or the target lacks it and
  applier never copied it). It is the only thing the hot path reads: one dict
  lookup per change, the dict empty when nothing syncs.
* :meth:`TableSyncs.classify` runs on the first change of a relation in a session
  (a mapping miss, the cold path): it decides the table's cut from its state row.
  An included table with no row, absent from the bootstrap's records and from the
  target, is recorded as ``skipped`` with one warning (run ``sync-tables``); one
  that applier copied (a ``ready`` row, or the bootstrap's ``bootstrap_table``)
  and the target lacks is not held: its mapping fails as before (the worker
  stops), because skipping it would lose its changes silently. Nor is a table
  renamed (or moved to another schema) on the source: the worker records the
  name under which it applies each source relation OID
  (``applier.source_relation``; before that, the OIDs the last bootstrap read
  under its snapshot), and an OID known under another name stops it
  with the ``ALTER TABLE`` the target needs, at every restart until the target
  follows (taken for a new table, its changes would be skipped, and stay
  skipped after the target's rename, until a full copy).
* :meth:`TableSyncs.start` (every session start, before streaming): records the
  tables the target has as ``ready`` when the origin has no row yet (the first
  start after migration 0008), and settles a ``handover`` a previous session or
  process left (it had stopped at its position: nothing after it was skipped).
* :meth:`TableSyncs.tick` (the loop, between batches): re-reads the states every
  :data:`REFRESH_INTERVAL` s, marks ``syncdone`` tables ``ready`` once the origin
  is past their cut, and answers a ``syncwait`` at a transaction boundary: it
  writes its position W (``handover``), pauses at most :data:`HANDOVER_WAIT` s
  until ``sync-tables`` has applied the table up to W and written the cut
  (``syncdone``), or takes the request back (``catchup``) so that W is never used
  once the worker went past it; it then answers that table again only after
  :data:`RETRY_AFTER` pauses' worth of time (a slow sync-tables meanwhile comes
  closer).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from psycopg import sql

from applier.config import Config
from applier.errors import SchemaMismatch
from applier.lsn import Lsn
from applier.origingroup import progress_sql

if TYPE_CHECKING:
    from applier.apply.core.states import State

log = logging.getLogger("applier.apply")

#: Seconds between two reads of the states by a running worker (as skip rules).
REFRESH_INTERVAL = 2.0
#: Longest pause of the worker at a handover (its stream is not read meanwhile).
HANDOVER_WAIT = 10.0
#: After a pause that ended without the table, the worker answers it again only after
#: this many pauses' worth of time: a sync-tables slower than the worker must not
#: pause it every few seconds.
RETRY_AFTER = 3
#: Above every LSN: skip all of the table's changes.
INF = Lsn(0xFFFFFFFFFFFFFFFF)
#: States in which the worker applies none of the table's changes.
HELD = frozenset({"skipped", "init", "copying", "catchup", "syncwait", "handover"})

Name = tuple[str, str]
Conn = psycopg.Connection[Any]


class SyncStream(Protocol):
    """What a handover reads and sends on the stream."""

    @property
    def keepalives_received(self) -> int: ...
    @property
    def last_received(self) -> Lsn: ...

    def send_status(self, reply_requested: bool = False) -> None: ...


class SyncHost(Protocol):
    """What a handover reads of the Applier: whether it is at a transaction boundary,
    and its position."""

    @property
    def state(self) -> State: ...
    @property
    def txn(self) -> object | None: ...
    @property
    def group_txns(self) -> int: ...
    @property
    def live(self) -> object | None: ...
    @property
    def progress(self) -> Lsn: ...


# Rows that a later bootstrap made moot (it copied everything anew) are left out.
_STATES = """
SELECT t.schema_name, t.table_name, t.state, t.lsn::text
  FROM applier.table_sync t
 WHERE t.origin = %(origin)s
   AND (t.state IN ('syncdone', 'ready') OR t.updated_at >= COALESCE(
        (SELECT b.finished_at FROM applier.bootstrap_run b
          WHERE b.slot = %(slot)s AND b.phase = 'done'), '-infinity'))
"""

_ONE = _STATES + " AND t.schema_name = %(schema)s AND t.table_name = %(name)s"

_BASELINE = (
    "INSERT INTO applier.table_sync (origin, schema_name, table_name, state) "
    "VALUES (%s, %s, %s, 'ready') ON CONFLICT DO NOTHING"
)

#: syncdone -> ready for every table whose catch-up the origin has passed (params:
#: origin, origin). Public: ``applier sync-tables`` runs it too, before it starts
#: new copies (:mod:`applier.synctables.command`).
MARK_READY = """
UPDATE applier.table_sync SET state = 'ready', slot = NULL, updated_at = pg_catalog.now()
 WHERE origin = %s AND state = 'syncdone'
   AND lsn <= """ + progress_sql()


def read_states(conn: Conn, origin: str, slot: str) -> dict[Name, tuple[str, Lsn | None]]:
    rows = conn.execute(_STATES, {"origin": origin, "slot": slot}).fetchall()
    return {(r[0], r[1]): (str(r[2]), None if r[3] is None else Lsn.parse(r[3])) for r in rows}


def cas_state(
    conn: Conn, origin: str, name: Name, old: tuple[str, Lsn | None], new: tuple[str, Lsn | None]
) -> bool:
    """Move a row from ``old`` (state, lsn) to ``new``, only if it is still ``old``."""
    cur = conn.execute(
        "UPDATE applier.table_sync SET state = %s, lsn = %s::pg_lsn, "
        "updated_at = pg_catalog.now() WHERE origin = %s AND schema_name = %s "
        "AND table_name = %s AND state = %s AND lsn IS NOT DISTINCT FROM %s::pg_lsn",
        (new[0], _txt(new[1]), origin, *name, old[0], _txt(old[1])),
    )
    return cur.rowcount == 1


def _txt(lsn: Lsn | None) -> str | None:
    return None if lsn is None else str(lsn)


def table_exists(conn: Conn, name: Name) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s "
        "AND c.relkind IN ('r', 'p')",
        name,
    ).fetchone()
    return row is not None


class TableSyncs:
    """Per-table cuts of one worker (see the module docstring); inert when disabled."""

    def __init__(self, cfg: Config, enabled: bool = True) -> None:
        self.cfg = cfg
        self.enabled = enabled
        self.origin = cfg.origin
        #: Relation OID -> cut (the hot path's only lookup).
        self.cut: dict[int, Lsn] = {}
        #: Counts the changes of :attr:`cut` (what the apply paths decided on it is
        #: decided again: applier.apply.batching.paths).
        self.generation = 0
        self.states: dict[Name, tuple[str, Lsn | None]] = {}
        #: Tables the bootstrap of our slot copied (applier knows them).
        self.booted: set[Name] = set()
        #: OIDs classified in this session (their cut is recomputed on each read).
        self.names: dict[int, Name] = {}
        #: Source relation OID -> the name the worker last applied it under.
        self.relids: dict[int, Name] = {}
        self.conn: Conn | None = None
        self._read = 0.0
        self._answer = False  # a syncwait to answer at the next transaction boundary
        self._withdrawn: dict[Name, float] = {}  # table -> when its pause ended without it

    # -- session start -----------------------------------------------------------------

    def start(self, conn: Conn) -> None:
        """Before streaming: baseline, bootstrap records, and a handover left behind."""
        if not self.enabled:
            return
        self.conn = conn
        self.cut.clear()
        self.generation += 1
        self.names.clear()
        booted = conn.execute(
            "SELECT src_schema, src_name, src_relid, run_id = max(run_id) OVER () "
            "FROM applier.bootstrap_table WHERE slot = %s",
            (self.cfg.source.slot,),
        ).fetchall()
        self.booted = {(r[0], r[1]) for r in booted}
        self._baseline(conn)
        # The OIDs the last bootstrap read under its snapshot, then what the worker
        # applied since (which supersedes them).
        self.relids = {int(r[2]): (r[0], r[1]) for r in booted if r[3] and r[2] is not None}
        self.relids.update(
            (int(r[0]), (r[1], r[2]))
            for r in conn.execute(
                "SELECT relid, schema_name, table_name FROM applier.source_relation "
                "WHERE origin = %s",
                (self.origin,),
            ).fetchall()
        )
        self._load(conn)
        left = [n for n, (st, _) in self.states.items() if st == "handover"]
        if left:
            log.info(
                "a handover left by an earlier run: waiting for sync-tables before streaming",
                extra={"ctx": {"tables": [f"{s}.{n}" for s, n in left]}},
            )
            # A previous session paused at its position W and stopped; this one has
            # processed nothing yet, so W still bounds everything skipped: settle it.
            self._wait(conn, {n: self.states[n] for n in left})
        self._read = time.monotonic()

    def _baseline(self, conn: Conn) -> None:
        """First start after migration 0008: the tables the target has are ready."""
        if conn.execute(
            "SELECT 1 FROM applier.table_sync WHERE origin = %s LIMIT 1", (self.origin,)
        ).fetchone():
            return
        rows = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN "
            "('pg_catalog', 'information_schema', 'applier') AND n.nspname NOT LIKE 'pg_%%'"
        ).fetchall()
        names = [(r[0], r[1]) for r in rows if self.cfg.tables.includes(r[0], r[1])]
        if names:
            with conn.cursor() as cur:
                cur.executemany(_BASELINE, [(self.origin, s, n) for s, n in names])
            log.info(
                "tables on the target recorded as ready", extra={"ctx": {"tables": len(names)}}
            )

    # -- the cold path -----------------------------------------------------------------

    def classify(
        self, oid: int, rel: Any, lsn: Lsn | None = None, xid: int | None = None
    ) -> Lsn | None:
        """The cut of relation ``oid`` (its first change in this session, at ``lsn``
        in transaction ``xid``); SchemaMismatch if it is a table renamed on the source."""
        if not self.enabled or rel is None:
            return None
        name = (rel.namespace, rel.name)
        try:
            if not self.cfg.tables.includes(*name):
                self._check_renamed(oid, name, excluded=True)
                return None
            self.names[oid] = name
            cut = self._cut_of(name, oid)
        except SchemaMismatch as e:
            e.context.update({"lsn": None if lsn is None else str(Lsn(lsn)), "xid": xid})
            raise
        self._set_cut(oid, cut)
        if cut != INF:
            self._remember(oid, name)
        return cut

    def _remember(self, oid: int, name: Name) -> None:
        """Record that source relation ``oid`` is applied as ``name`` (a write only when
        the name is new for the OID: a first start, a table synced or renamed)."""
        if self.relids.get(oid) == name or self.conn is None:
            return
        self.conn.execute(
            "INSERT INTO applier.source_relation (origin, relid, schema_name, table_name) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (origin, relid) DO UPDATE SET "
            "schema_name = EXCLUDED.schema_name, table_name = EXCLUDED.table_name, "
            "updated_at = pg_catalog.now()",
            (self.origin, oid, *name),
        )
        self.relids[oid] = name

    def _check_renamed(self, oid: int, name: Name, excluded: bool = False) -> None:
        """Before ``name`` is taken for a new table, or for one ``[tables]`` leaves out
        (``excluded``): is it a table applied until now and renamed on the source?"""
        was = self.relids.get(oid)
        if was is None or was == name or self.conn is None:
            return
        old, new = f"{was[0]}.{was[1]}", f"{name[0]}.{name[1]}"
        steps = []
        if was[1] != name[1]:
            rename = sql.SQL("ALTER TABLE {} RENAME TO {}")
            steps.append(rename.format(sql.Identifier(*was), sql.Identifier(name[1])))
        if was[0] != name[0]:
            move = sql.SQL("ALTER TABLE {} SET SCHEMA {}")
            steps.append(move.format(sql.Identifier(was[0], name[1]), sql.Identifier(name[0])))
        todo = "; ".join(st.as_string(self.conn) for st in steps)
        if excluded:
            forget = sql.SQL(
                "DELETE FROM applier.source_relation WHERE origin = {} AND relid = {}"
            ).format(sql.Literal(self.origin), sql.Literal(oid))
            raise SchemaMismatch(
                f"table {old} was renamed on the source to {new}, which [tables] does not "
                "include: its changes would be dropped",
                table=new,
                hint=f"include {new} in [tables] and do the same on the target ({todo}), or "
                "take the table out of the publication; then restart applier run. If "
                f"{old} was dropped and {new} is another table that took its OID: "
                f"{forget.as_string(self.conn)}",
            )
        raise SchemaMismatch(
            f"table {old} was renamed on the source to {new}, which the target does not have",
            table=new,
            hint=f"do the same on the target ({todo}) and restart applier run: none of its "
            f"changes since the rename were applied. If {old} was dropped and {new} is a new "
            f"table that took its OID, copy it: applier sync-tables --config F --tables {new}",
        )

    def commit_dependent(self) -> bool:
        """Whether a change's fate may depend on its transaction's commit LSN (a cut
        between handover and ready): then no transaction is applied live."""
        states = self.states.values()
        return self.enabled and any(st in ("handover", "syncdone") for st, _ in states)

    def qualname(self, oid: int) -> str:
        s, n = self.names.get(oid, ("?", str(oid)))
        return f"{s}.{n}"

    def _cut_of(self, name: Name, oid: int) -> Lsn | None:
        st = self.states.get(name)
        if st is not None:
            state, lsn = st
            if state == "ready":
                return None
            if state == "syncdone":
                return lsn
            return INF
        conn = self.conn
        if conn is None or name in self.booted:
            return None
        # The table first, then its row: sync-tables commits the row before it creates
        # the table, so a table seen here has its row seen below (states read up to
        # REFRESH_INTERVAL ago may not have it yet).
        exists = table_exists(conn, name)
        args = {"origin": self.origin, "slot": self.cfg.source.slot}
        row = conn.execute(_ONE, {**args, "schema": name[0], "name": name[1]}).fetchone()
        if row is not None:
            self.states[name] = (str(row[2]), None if row[3] is None else Lsn.parse(row[3]))
            return self._cut_of(name, oid)
        if exists:
            return None
        self._check_renamed(oid, name)
        return self._record_skipped(conn, name, oid)

    def _record_skipped(self, conn: Conn, name: Name, oid: int) -> Lsn | None:
        cur = conn.execute(
            "INSERT INTO applier.table_sync (origin, schema_name, table_name, state) "
            "VALUES (%s, %s, %s, 'skipped') ON CONFLICT DO NOTHING",
            (self.origin, *name),
        )
        if cur.rowcount != 1:  # sync-tables got there first
            self._load(conn)
            return self._cut_of(name, oid) if name in self.states else INF
        self.states[name] = ("skipped", None)
        table = f"{name[0]}.{name[1]}"
        log.warning(
            "table %s is published but does not exist on the target and applier never "
            "copied it: its changes are skipped until it is copied; run `applier "
            "sync-tables --config F --tables %s`",
            table,
            table,
            extra={"ctx": {"table": table}},
        )
        return INF

    # -- the loop ----------------------------------------------------------------------

    @property
    def wants_handover(self) -> bool:
        """A hand-over is to be answered at the next transaction boundary."""
        return bool(self._answer)

    def tick(self, now: float, applier: SyncHost, stream: SyncStream) -> None:
        """Between batches: re-read the states (every few seconds), answer a syncwait."""
        if not self.enabled or self.conn is None:
            return
        if now - self._read >= REFRESH_INTERVAL:
            self._read = now
            self._load(self.conn)
            if any(st == "syncdone" for st, _ in self.states.values()):
                self.conn.execute(MARK_READY, (self.origin, self.origin))
            self._answer = any(self._due(n, st) for n, (st, _) in self.states.items())
        if self._answer and _at_boundary(applier):
            if not stream.keepalives_received:
                # W must cover what earlier sessions skipped and confirmed: a keepalive's
                # wal_end (the walsender's sent position) is at or past the slot's
                # confirmed point, where this session's stream began.
                stream.send_status(reply_requested=True)
                return
            self._answer = False
            self._handover(self.conn, applier, stream)

    def _load(self, conn: Conn) -> None:
        states = read_states(conn, self.origin, self.cfg.source.slot)
        if states != self.states:
            self.states = states
            self._recut()

    def _recut(self) -> None:
        for oid, name in self.names.items():
            self._set_cut(oid, self._cut_of(name, oid))

    def _set_cut(self, oid: int, cut: Lsn | None) -> None:
        if self.cut.get(oid) == cut:
            return
        if cut is None:
            del self.cut[oid]
        else:
            self.cut[oid] = cut
        self.generation += 1

    def _handover(self, conn: Conn, applier: SyncHost, stream: SyncStream) -> None:
        """At a transaction boundary: everything this worker skipped ends at or before
        W; record W and pause until sync-tables applied the table up to it."""
        w = Lsn(max(stream.last_received, applier.progress))
        asked: dict[Name, tuple[str, Lsn | None]] = {}
        for name, (state, lsn) in self.states.items():
            if not self._due(name, state):
                continue
            mine = Lsn(max(w, lsn or 0))
            if cas_state(conn, self.origin, name, (state, lsn), ("handover", mine)):
                asked[name] = ("handover", mine)
                log.info(
                    "handing a synced table over: pausing until sync-tables reaches %s",
                    mine,
                    extra={"ctx": {"table": f"{name[0]}.{name[1]}", "lsn": mine}},
                )
        if asked:
            self._wait(conn, asked, stream)
        self._load(conn)

    def _due(self, name: Name, state: str) -> bool:
        """A handover to answer now (not within RETRY_AFTER of a fruitless pause)."""
        if state not in ("syncwait", "handover"):
            return False
        ended = self._withdrawn.get(name, float("-inf"))
        return time.monotonic() - ended >= RETRY_AFTER * self._pause()

    def _pause(self) -> float:
        return min(HANDOVER_WAIT, self.cfg.apply.timeout / 4)

    def _wait(
        self,
        conn: Conn,
        asked: dict[Name, tuple[str, Lsn | None]],
        stream: SyncStream | None = None,
    ) -> None:
        """Wait for ``syncdone``; past the deadline take each request back (CAS)."""
        wait = self._pause()
        deadline = time.monotonic() + wait
        pending = dict(asked)
        last_status = time.monotonic()
        while pending and time.monotonic() < deadline:
            states = read_states(conn, self.origin, self.cfg.source.slot)
            pending = {n: v for n, v in pending.items() if states.get(n) == v}
            if pending:
                time.sleep(0.05)
                if stream is not None and time.monotonic() - last_status >= 1.0:
                    last_status = time.monotonic()
                    stream.send_status()
        for name, old in pending.items():
            self._withdrawn[name] = time.monotonic()
            if cas_state(conn, self.origin, name, old, ("catchup", old[1])):
                log.warning(
                    "sync-tables did not reach the worker's position in %.0f s; going on "
                    "(answering it again in %.0f s)",
                    wait,
                    RETRY_AFTER * wait,
                    extra={"ctx": {"table": f"{name[0]}.{name[1]}"}},
                )
        self.states = read_states(conn, self.origin, self.cfg.source.slot)
        self._recut()


def _at_boundary(applier: SyncHost) -> bool:
    """Between transactions, with nothing of one in hand (its changes all dispatched)."""
    from applier.apply.core.states import State

    return (
        applier.state is State.IDLE
        and applier.txn is None
        and not applier.group_txns
        and applier.live is None  # a live streamed txn is open
    )


#: For an Applier without a worker (tests, the catch-up of sync-tables itself).
class _Inert(TableSyncs):
    def __init__(self) -> None:
        self.cut = {}
        self.generation = 0
        self.enabled = False
        self.names = {}

    def classify(
        self, oid: int, rel: Any, lsn: Lsn | None = None, xid: int | None = None
    ) -> Lsn | None:
        return None


NO_SYNCS: TableSyncs = _Inert()
