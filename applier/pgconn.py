"""Every connection applier opens, to either server: one way to open it, its session pinned.

Why pin
=======

A database or role default (``ALTER DATABASE/ROLE ... SET``) reaches every
new session, applier's included. Left alone, one can make applier's driver
fail to read a value (``DateStyle 'SQL, MDY'``: psycopg cannot parse that
``timestamptz``), lose exactness (``extra_float_digits -15``,
``IntervalStyle sql_standard``), cancel its statements (``statement_timeout
1ms``), fail its commits (``serializable``), or run someone else's code with
applier's privileges: a ``search_path`` whose first schema anyone can write to
may hold a ``now()`` or an ``=`` for ``int4`` that a planner picks over the
catalog's. PostgreSQL's own apply worker empties ``search_path`` for that
reason; applier pins it to ``pg_catalog`` and schema-qualifies every other
object it names (its own ``applier.*`` tables, the user's tables and types).

How
===

The settings go in the libpq startup packet (``options='-c name=value ...'``,
appended to any ``options`` the DSN or ``PGOPTIONS`` has, so ours win):
startup options take precedence over database and role defaults, cost no
round trip, and are in force before the first query, so a 1 ms
``statement_timeout`` cannot cancel the pinning itself. Replication
connections take them too (the walsender formats pgoutput's text values with
its session's ``DateStyle`` etc.), and the ``psql``/``pg_dump`` children of the
bootstrap get them through :func:`pinned_conninfo`.

A setting a server does not know is a FATAL error at startup, and a FATAL
line in a server's log is what its DBA watches for, so the ones newer than
some supported servers (:data:`VERSIONED`) go in the startup packet only to
servers known to have them. The first connection to a DSN (version not known
yet) sends the ones every supported target has (:data:`STARTUP_SINCE`) and,
connected, sets the rest that the server has with one plain ``SET`` before
anything else runs (a transaction timeout cannot cut a statement of
microseconds); later connections to that DSN know the version and send them
all at startup. Should even the first packet be refused for one (a source
older than 14), it connects again without it.

What is pinned is :func:`settings`; a few settings that need a privilege or
depend on the session are still set after connecting
(:func:`applier.apply.target.connection.pin`: the apply session's
``session_replication_role`` and ``synchronous_commit``).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, overload

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .refusal import refusal

__all__ = [
    "PINNED",
    "VERSIONED",
    "Side",
    "close_quietly",
    "connect",
    "known_version",
    "local_conninfo",
    "pinned_conninfo",
    "settings",
    "startup_options",
]

log = logging.getLogger("applier")

Side = Literal["source", "target"]
C = TypeVar("C", bound=psycopg.Connection[Any])

#: Seconds a connection may take to be made, unless the caller says otherwise.
CONNECT_TIMEOUT = 10

#: Pinned on every connection to either server: (name, value, why).
PINNED: tuple[tuple[str, str, str], ...] = (
    # Output formats: what applier reads (and the stream, the COPY text, the verify's
    # row text) is the same whatever the defaults, and exact.
    # (client_encoding UTF8 goes as the libpq keyword: the stream's text is UTF8.)
    ("datestyle", "ISO", "psycopg cannot parse a timestamptz in the other styles"),
    ("intervalstyle", "postgres", "psycopg parses this style of interval only"),
    ("timezone", "UTC", "timestamptz text the same on both servers"),
    ("extra_float_digits", "3", "float text round-trips exactly (at 0 or below it is rounded)"),
    # No one else's code: every other object is schema-qualified (see "Why pin").
    ("search_path", "pg_catalog", "a function or operator planted on the path never runs"),
    # A group, a COPY or a wait on a user's lock may take long; none is an error.
    ("statement_timeout", "0", "a long COPY or group is legitimate"),
    ("lock_timeout", "0", "waiting on a target user's row lock is legitimate"),
    ("idle_in_transaction_session_timeout", "0", "the bootstrap keeps a snapshot open"),
    # Under serializable, COMMIT can fail with 40001 after the origin stamp, again and again.
    ("default_transaction_isolation", "read committed", "the built-in apply worker's"),
)

#: Pinned where the server has them (name, value, first server_version, why).
VERSIONED: tuple[tuple[str, str, int, str], ...] = (
    ("idle_session_timeout", "0", 140000, "the status and probe connections idle"),
    ("transaction_timeout", "0", 170000, "a long COPY or group is legitimate"),
)

#: A first connection (server version not known) sends at startup the versioned
#: settings this old, and sets the newer ones once connected (see "How").
STARTUP_SINCE = 140000

#: applier writes on the target only; on the source it reads (slots are made and
#: dropped by functions and replication commands, which read-only allows).
READ_ONLY: Mapping[Side, str] = {"source": "on", "target": "off"}

#: Server versions seen, by the DSN a connection was made with (see "How").
_versions: dict[str, int] = {}


def settings(
    side: Side, server_version: int | None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The settings of a ``side`` session on a server of ``server_version`` (None:
    not known, every versioned one); ``extra`` (the caller's own) wins."""
    out = {name: value for name, value, _ in PINNED}
    for name, value, since, _ in VERSIONED:
        if server_version is None or server_version >= since:
            out[name] = value
    out["default_transaction_read_only"] = READ_ONLY[side]
    out.update(extra or {})
    return out


def _escape(value: str) -> str:
    # libpq's options split on spaces unless escaped with a backslash.
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def startup_options(conninfo: str, pinned: Mapping[str, str]) -> str:
    """``options`` of ``conninfo`` (or ``PGOPTIONS``) followed by ``-c`` for each pinned
    setting: the last ``-c`` of a name wins."""
    params = conninfo_to_dict(conninfo)
    theirs = str(params.get("options") or os.environ.get("PGOPTIONS") or "")
    ours = " ".join(f"-c {name}={_escape(value)}" for name, value in pinned.items())
    return f"{theirs} {ours}".strip()


def pinned_conninfo(
    conninfo: str,
    side: Side,
    *,
    server_version: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> str:
    """``conninfo`` with the pinned settings in ``options`` and ``client_encoding`` UTF8:
    for a child process (``psql``, ``pg_dump``) or a driver that connects itself.

    ``server_version`` None: the version seen on this DSN by :func:`connect`, else
    none of :data:`VERSIONED` (a child cannot retry: pass it when known).
    """
    version = server_version if server_version is not None else _versions.get(conninfo, 0)
    opts = startup_options(conninfo, settings(side, version, extra))
    return make_conninfo(local_conninfo(conninfo), options=opts, client_encoding="UTF8")


_UNKNOWN = re.compile(r'unrecognized configuration parameter "([^"]+)"')

#: A ``passfile`` value naming a secret file shipped with a Spark job
#: (:mod:`applier.bootstrap.executors`): ``spark-file:NAME`` is the file's copy
#: in the task's own Spark files directory.
SHIPPED = "spark-file:"


def local_conninfo(conninfo: str) -> str:
    """``conninfo`` with a shipped ``passfile`` (:data:`SHIPPED`) made the path of its
    copy here, readable by this user only (libpq ignores a passfile others can read)."""
    if SHIPPED not in conninfo:
        return conninfo
    params = conninfo_to_dict(conninfo)
    name = str(params.get("passfile") or "")
    if not name.startswith(SHIPPED):
        return conninfo
    from pyspark import SparkFiles

    path = SparkFiles.get(name[len(SHIPPED) :])
    os.chmod(path, 0o600)  # Spark copies files with the umask's mode
    return make_conninfo(conninfo, passfile=path)


@overload
def connect(
    conninfo: str,
    *,
    side: Side,
    purpose: str,
    replication: bool = ...,
    autocommit: bool = ...,
    connect_timeout: int = ...,
    extra: Mapping[str, str] | None = ...,
    connection_class: type[C],
    **kw: Any,
) -> C: ...


@overload
def connect(
    conninfo: str,
    *,
    side: Side,
    purpose: str,
    replication: bool = ...,
    autocommit: bool = ...,
    connect_timeout: int = ...,
    extra: Mapping[str, str] | None = ...,
    **kw: Any,
) -> psycopg.Connection[Any]: ...


def connect(
    conninfo: str,
    *,
    side: Side,
    purpose: str,
    replication: bool = False,
    autocommit: bool = True,
    connect_timeout: int = CONNECT_TIMEOUT,
    extra: Mapping[str, str] | None = None,
    connection_class: type[psycopg.Connection[Any]] = psycopg.Connection,
    **kw: Any,
) -> psycopg.Connection[Any]:
    """A connection to ``side`` with its session pinned (see the module doc).

    ``purpose`` is its ``application_name`` (what ``pg_stat_activity`` shows);
    ``replication`` opens a ``replication=database`` connection; ``extra`` are
    settings of the caller's that override the pinned ones (a verify's own
    statement_timeout, the server side of keepalives); ``kw`` go to psycopg.
    A server's refusal of what the config names (a wrong password, a missing role
    or database, no pg_hba.conf line) raises :class:`applier.refusal.ConnectRefused`
    (exit 2); other errors are psycopg's as they are: each caller says what failed
    its way.
    """
    if replication:
        kw["replication"] = "database"
    version = _versions.get(conninfo)
    pinned = settings(side, STARTUP_SINCE if version is None else version, extra)
    while True:
        ci = make_conninfo(
            local_conninfo(conninfo),
            options=startup_options(conninfo, pinned),
            client_encoding="UTF8",
        )
        try:
            conn = connection_class.connect(
                ci, autocommit=autocommit, application_name=purpose,
                connect_timeout=connect_timeout, **kw,
            )  # fmt: skip
            break
        except psycopg.OperationalError as e:
            if version is not None or (name := _unknown_versioned(e, pinned)) is None:
                # A refusal (password, role, database, pg_hba) is the config's fault:
                # one place decides, for every command (applier.refusal).
                refused = refusal(e, side, conninfo)
                if refused is not None:
                    raise refused from None
                raise
            log.debug("the %s server lacks %s; connecting without it", side, name)
            del pinned[name]
    if version is None:
        _set_newer(conn, settings(side, conn.info.server_version, extra), pinned)
    _versions[conninfo] = conn.info.server_version
    return conn


def _set_newer(
    conn: psycopg.Connection[Any], wanted: Mapping[str, str], sent: Mapping[str, str]
) -> None:
    """Set what ``wanted`` has beyond what the startup packet ``sent`` (see "How").

    A plain SET through libpq, outside psycopg's transaction handling: it is
    committed at once on any connection, and a replication connection (which
    takes no extended-protocol query) runs it too.
    """
    for name, value in wanted.items():
        if name in sent:
            continue
        stmt = f"SET {name} = '{value}'"  # names and values are our own constants
        res = conn.pgconn.exec_(stmt.encode())
        if res.status != psycopg.pq.ExecStatus.COMMAND_OK:
            msg = (res.error_message or b"").decode(errors="replace").strip()
            conn.close()
            raise psycopg.OperationalError(f"cannot pin {name} on a new connection: {msg}")


def _unknown_versioned(e: psycopg.OperationalError, pinned: Mapping[str, str]) -> str | None:
    """The versioned setting the server refused at startup, if that is why it refused."""
    m = _UNKNOWN.search(str(e))
    versioned = {name for name, *_ in VERSIONED}
    if m and m.group(1) in versioned and m.group(1) in pinned:
        return m.group(1)
    return None


def known_version(conninfo: str) -> int | None:
    """The server_version a connection made with ``conninfo`` found (None: none made)."""
    return _versions.get(conninfo)


def close_quietly(conn: psycopg.Connection[Any], what: str) -> None:
    """Close ``conn`` even when it is broken (a target connection of
    :func:`applier.apply.target.connection.connect` then records its backend as abandoned);
    a failure to close must not mask the error in hand. ``what`` names the
    connection in the debug line (``"apply"``, ``"catalog"``, ``"status"``: all the target's)."""
    try:
        conn.close()
    except Exception:
        log.debug("closing the %s connection failed", what, exc_info=True)
