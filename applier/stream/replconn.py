"""One ``replication=database`` connection to the source: replication commands over psycopg 3.

psycopg 3 has no replication API, so this module speaks the walsender's
replication commands (IDENTIFY_SYSTEM, TIMELINE_HISTORY, CREATE_REPLICATION_SLOT,
DROP_REPLICATION_SLOT; also plain SQL on ``pg_replication_slots``) as plain SQL
text over the *simple* query protocol: the walsender refuses the extended
protocol, and psycopg only uses the simple protocol for a query without
parameters (``conn.execute(bytes, prepare=False)``).
Having no parameters, every identifier and literal is quoted here
(:func:`quote_ident`, :func:`quote_literal`).

Commands go through psycopg's ``Connection.execute`` rather than raw libpq
calls because psycopg waits for the server in its own loop, which releases
the GIL; CREATE_REPLICATION_SLOT can wait a long time for running
transactions to finish, and other threads (the Spark bootstrap's progress
display, the apply worker) must keep running meanwhile.

The COPY BOTH stream itself lives in :mod:`applier.stream.client`; it drives
``conn.pgconn`` directly and never blocks inside libpq.

Every server error is mapped to an applier error with a hint
(:func:`map_server_error`): a missing slot is :class:`SlotMissing`, a slot
that exists already :class:`SlotExists`, refused settings/privileges/objects
:class:`SourceError`, and a broken connection :class:`ConnectionLost` (the
retryable branch). DSNs only reach messages through :func:`redact_dsn`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import psycopg

from applier import pgconn
from applier.errors import (
    ApplierError,
    ConnectionLost,
    SlotExists,
    SlotMissing,
    SourceError,
    SourceRefused,
)
from applier.lsn import Lsn
from applier.redact import redact_dsn
from applier.refusal import state_of
from applier.stream import versions

__all__ = [
    "ReplicationConnection",
    "SlotInfo",
    "SlotState",
    "SystemInfo",
    "map_server_error",
    "quote_ident",
    "quote_literal",
]

log = logging.getLogger("applier.stream")

# SQLSTATEs we explain; everything else becomes a SourceError carrying its SQLSTATE.
_UNDEFINED_OBJECT = "42704"
_DUPLICATE_OBJECT = "42710"
_INSUFFICIENT_PRIVILEGE = "42501"
_OBJECT_IN_USE = "55006"
_PREREQUISITE_STATE = "55000"
_INVALID_AUTHORIZATION = "28000"
_INVALID_PASSWORD = "28P01"
_INVALID_CATALOG_NAME = "3D000"
_TOO_MANY_CONNECTIONS = "53300"
# Class 08 (connection exception) and 57P0x (admin/crash shutdown, cannot connect now).
_CONNECTION_CLASSES = ("08", "57P01", "57P02", "57P03", "57P05")

_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")

CREATE_HINT = (
    "create it with `applier bootstrap` (`applier run` creates a missing slot only for an "
    "origin that has no progress yet)"
)


@dataclass(frozen=True)
class SystemInfo:
    """IDENTIFY_SYSTEM: the cluster, its timeline, its current WAL flush position."""

    systemid: str
    timeline: int
    xlogpos: Lsn
    dbname: str | None


@dataclass(frozen=True)
class SlotInfo:
    """CREATE_REPLICATION_SLOT's answer. ``snapshot_name`` is set only with snapshot="export"."""

    slot_name: str
    consistent_point: Lsn
    snapshot_name: str | None
    output_plugin: str


@dataclass(frozen=True)
class SlotState:
    """A slot as ``pg_replication_slots`` shows it (what the apply worker checks)."""

    slot_name: str
    slot_type: str  # 'logical' or 'physical'
    plugin: str | None
    database: str | None
    two_phase: bool
    confirmed_flush_lsn: Lsn | None
    active: bool
    failover: bool = False  # PostgreSQL 17+; always false before


def quote_ident(name: str) -> str:
    """``name`` as a double-quoted identifier (case kept, ``"`` doubled)."""
    if "\x00" in name:
        raise ApplierError(f"identifier {name!r} contains a NUL byte")
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """``value`` as a single-quoted literal for the replication grammar (``'`` doubled).

    The replication command scanner knows no backslash escapes, so doubling
    quotes is the whole job; a NUL cannot be sent at all.
    """
    if "\x00" in value:
        raise ApplierError(f"literal {value!r} contains a NUL byte")
    return "'" + value.replace("'", "''") + "'"


def map_server_error(
    sqlstate: str | None, message: str, *, slot: str | None = None, where: str = ""
) -> ApplierError:
    """The applier error (with a hint) for a server error while doing ``where``."""
    state = sqlstate or ""
    text = f"{where}: {message}" if where else message
    low = message.lower()
    ctx: dict[str, Any] = {"sqlstate": state or None}
    if state.startswith(_CONNECTION_CLASSES) or (not state and "connection" in low):
        return ConnectionLost(
            text,
            hint="the source server closed the connection (restart, shutdown or the "
            "walsender was terminated); applier run reconnects and resumes from its last "
            "committed position",
            **ctx,
        )
    if state == _UNDEFINED_OBJECT and "replication slot" in low:
        return SlotMissing(
            f"replication slot {slot!r} does not exist" if slot else text,
            hint=CREATE_HINT,
            **ctx,
        )
    if state == _DUPLICATE_OBJECT and "replication slot" in low:
        return SlotExists(
            text,
            hint="use it, drop it (bootstrap --recreate-slot) or pick another slot name",
            **ctx,
        )
    if state == _UNDEFINED_OBJECT and "publication" in low:
        return SourceError(
            text,
            hint="create the publication on the source (CREATE PUBLICATION ... FOR TABLE ...) "
            "or fix source.publications",
            **ctx,
        )
    if state == _OBJECT_IN_USE:
        return SourceError(
            text,
            hint="another consumer is using this slot; stop it (or wait for its walsender "
            "to exit) before starting another",
            **ctx,
        )
    if state == _PREREQUISITE_STATE and "wal_level" in low:
        return SourceRefused(
            text, hint="set wal_level = logical on the source and restart it", **ctx
        )
    if state in (_INSUFFICIENT_PRIVILEGE, _INVALID_AUTHORIZATION) or "replication role" in low:
        # Refused at every try until someone changes the role: permanent (exit 3).
        return SourceRefused(
            text,
            hint="the source role needs the REPLICATION attribute: run ALTER ROLE ... "
            "REPLICATION on the source (and a pg_hba.conf line allowing it to connect)",
            **ctx,
        )
    if state == _INVALID_PASSWORD:
        return SourceError(text, hint="check the source password (password_file, ~/.pgpass)", **ctx)
    if state == _INVALID_CATALOG_NAME:
        return SourceError(text, hint="check dbname in source.dsn", **ctx)
    if state == _TOO_MANY_CONNECTIONS or "wal senders" in low or "max_wal_senders" in low:
        return SourceError(
            text, hint="raise max_wal_senders / max_connections on the source", **ctx
        )
    return SourceError(text, **ctx)


def error_from_psycopg(
    exc: psycopg.Error, *, slot: str | None = None, where: str = ""
) -> ApplierError:
    """Map a psycopg exception; its primary message is used, without the DSN."""
    diag_msg = exc.diag.message_primary if exc.diag is not None else None
    message = diag_msg or str(exc).strip() or type(exc).__name__
    if exc.sqlstate is None and isinstance(exc, psycopg.OperationalError):
        # A failed connect carries no SQLSTATE: tell refusals from unreachability by text.
        state = state_of(message)
        if state is None:
            return ConnectionLost(
                f"{where}: {message}" if where else message,
                hint="check that the source server is up and reachable; applier run retries",
            )
        return map_server_error(state, message, slot=slot, where=where)
    return map_server_error(exc.sqlstate, message, slot=slot, where=where)


#: libpq connect failure texts -> the SQLSTATE the server used (lost in libpq's message).
def _flag(value: Any) -> bool:
    # The simple protocol gives text: 't'/'f' unless psycopg already loaded a bool.
    return value is True or value in ("t", "true")


class ReplicationConnection:
    """Owns one replication=database connection (psycopg 3, autocommit, simple protocol only)."""

    def __init__(self, conn: psycopg.Connection[Any], redacted_dsn: str) -> None:
        self.conn = conn
        self.redacted_dsn = redacted_dsn
        self.server_version: int = conn.info.server_version
        self._closed = False

    @classmethod
    def open(
        cls, conninfo: str, *, application_name: str = "applier", connect_timeout: int = 10
    ) -> ReplicationConnection:
        """Connect with ``replication=database``, the session pinned (:mod:`applier.pgconn`:
        pgoutput's text values take the walsender's formats); map refusals to errors."""
        redacted = redact_dsn(conninfo)
        try:
            conn: psycopg.Connection[Any] = pgconn.connect(
                conninfo, side="source", purpose=application_name, replication=True,
                connect_timeout=connect_timeout,
            )  # fmt: skip
        except psycopg.Error as e:  # a refusal raised ConnectRefused (pgconn)
            err = error_from_psycopg(e, where=f"cannot open a replication connection to {redacted}")
            raise err from None
        log.debug("replication connection open", extra={"ctx": {"dsn": redacted}})
        return cls(conn, redacted)

    # -- commands --------------------------------------------------------------

    def command(self, sql: str, *, slot: str | None = None) -> list[tuple[Any, ...]]:
        """Run one replication command or simple SQL statement; return its rows.

        No parameters: the walsender only speaks the simple query protocol.
        """
        where = sql.split("(", 1)[0].strip()
        try:
            cur = self.conn.execute(sql.encode(), prepare=False)
            return cur.fetchall() if cur.description else []
        except psycopg.Error as e:
            raise error_from_psycopg(e, slot=slot, where=where) from None

    def publications(self) -> list[str]:
        """The names of the database's publications (checked before streaming)."""
        return [str(r[0]) for r in self.command("SELECT pubname FROM pg_catalog.pg_publication")]

    def identify_system(self) -> SystemInfo:
        systemid, timeline, xlogpos, dbname = self.command("IDENTIFY_SYSTEM")[0]
        return SystemInfo(
            systemid=str(systemid),
            timeline=int(timeline),
            xlogpos=Lsn.parse(str(xlogpos)),
            dbname=None if dbname is None else str(dbname),
        )

    def create_slot(
        self,
        name: str,
        *,
        snapshot: Literal["export", "nothing", "use"] = "nothing",
        temporary: bool = False,
        two_phase: bool = False,
        failover: bool = False,
    ) -> SlotInfo:
        """CREATE_REPLICATION_SLOT with pgoutput, in the server's syntax
        (:func:`applier.stream.versions.create_slot_sql`).

        With ``snapshot="export"`` the snapshot stays valid until the next
        command on this connection or :meth:`close`; with ``"use"`` the
        connection must be inside a transaction (bootstrap's own business).
        """
        sql = versions.create_slot_sql(
            quote_ident(name),
            self.server_version,
            snapshot=snapshot,
            temporary=temporary,
            two_phase=two_phase,
            failover=failover,
        )
        row = self.command(sql, slot=name)[0]
        info = SlotInfo(
            slot_name=str(row[0]),
            consistent_point=Lsn.parse(str(row[1])),
            snapshot_name=None if row[2] is None else str(row[2]),
            output_plugin=str(row[3]),
        )
        log.info(
            "replication slot created",
            extra={
                "ctx": {"slot": name, "consistent_point": info.consistent_point}
                | ({"failover": True} if failover else {})
            },
        )
        return info

    def set_slot_failover(self, name: str, failover: bool) -> None:
        """ALTER_REPLICATION_SLOT ... (FAILOVER ...): PostgreSQL 17+, the slot not in use."""
        self.command(versions.alter_failover_sql(quote_ident(name), failover), slot=name)
        log.info("replication slot altered", extra={"ctx": {"slot": name, "failover": failover}})

    def slot_exists(self, name: str) -> bool:
        # Slot names are [a-z0-9_] (ReplicationSlotValidateName), so a name that
        # is not one cannot exist, and a valid one needs no escaping in SQL.
        if not _SLOT_NAME.match(name):
            return False
        sql = f"SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = '{name}'"  # noqa: S608
        return bool(self.command(sql))

    def slot_state(self, name: str) -> SlotState | None:
        """The slot's row of ``pg_replication_slots``, None when there is no such slot.

        A ``replication=database`` walsender runs plain SQL too (simple protocol).
        """
        if not _SLOT_NAME.match(name):
            return None
        rows = self.command(versions.slot_state_sql(self.server_version, f"'{name}'"))
        if not rows:
            return None
        name_, kind, plugin, database, two_phase, confirmed, active, failover = rows[0]
        return SlotState(
            slot_name=str(name_),
            slot_type=str(kind),
            plugin=None if plugin is None else str(plugin),
            database=None if database is None else str(database),
            two_phase=_flag(two_phase),
            confirmed_flush_lsn=None if confirmed is None else Lsn.parse(str(confirmed)),
            active=_flag(active),
            failover=_flag(failover),
        )

    def timeline_history(self, timeline: int) -> list[tuple[int, Lsn]]:
        """TIMELINE_HISTORY: ``(parent timeline, switch point)`` for each ancestor, oldest first.

        Each line of the history file says where the server switched from a
        parent timeline to the next; comments and blank lines are skipped.
        """
        rows = self.command(f"TIMELINE_HISTORY {int(timeline)}")
        content = rows[0][1] if rows else b""
        text = bytes(content).decode() if isinstance(content, bytes | memoryview) else str(content)
        out = []
        for line in text.splitlines():
            fields = line.split()
            if len(fields) >= 2 and not line.lstrip().startswith("#"):
                out.append((int(fields[0]), Lsn.parse(fields[1])))
        return out

    def drop_slot(self, name: str, *, wait: bool = True) -> None:
        """DROP_REPLICATION_SLOT; ``wait`` waits for an active consumer to go away."""
        sql = f"DROP_REPLICATION_SLOT {quote_ident(name)}{' WAIT' if wait else ''}"
        self.command(sql, slot=name)
        log.info("replication slot dropped", extra={"ctx": {"slot": name}})

    # -- life cycle -------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed or self.conn.closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.conn.close()

    def __enter__(self) -> ReplicationConnection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
