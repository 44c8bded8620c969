"""The bootstrap's connections: the settings they are pinned to, and how a
``psql``/``pg_dump`` child gets its connection without exposing a secret.

Pinned settings
---------------
Every target session (the driver's and each copy task's) and the source
``psql`` children that stream the copies run with the same output formats as
the stream (``source_conninfo`` in :mod:`applier.apply.worker`):
``client_encoding`` UTF8 on both ends (a LATIN1 source reaches a UTF8 target
as UTF-8; the server converts), ``DateStyle`` ISO, ``IntervalStyle``
postgres, ``extra_float_digits`` 3 and ``TimeZone`` UTC, so a text-format
COPY reads back exactly what it wrote whatever the source database's or
role's defaults say. Target sessions also get ``statement_timeout``,
``lock_timeout``, ``idle_in_transaction_session_timeout`` and (PG17+)
``transaction_timeout`` 0 and ``default_transaction_isolation`` read
committed: a timeout or a serializable default set on the target's database
or role would otherwise kill a long COPY, an index build, or the driver's
transaction that stays open while ``pg_dump`` runs. The source children get
the three timeouts too (a long COPY must not be cancelled by them).

Child processes
---------------
A child gets the connection string itself, ``--dbname=<conninfo>``, so every
libpq keyword (``sslmode``, ``sslrootcert``, ``channel_binding``,
``require_auth``, ...) reaches it as it is. The command line is readable by
every local user (``ps``), so the secret keys are taken out of it: the
password goes in ``PGPASSWORD`` (a process's environment is readable only by
its user and root), ``sslpassword`` (which has no environment variable) in a
0600 service file that lives only while the child starts.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..apply.targetconn import TIMEOUT_SETTINGS, no_timeouts, pin
from ..errors import BootstrapError

#: Output formats of a text COPY (and of everything else), as the stream's.
FORMAT_SETTINGS: tuple[tuple[str, str], ...] = (
    ("client_encoding", "UTF8"),
    ("datestyle", "ISO"),
    ("intervalstyle", "postgres"),
    ("extra_float_digits", "3"),
    ("timezone", "UTC"),
)


def target_settings(server_version: int) -> list[tuple[str, str]]:
    return [*FORMAT_SETTINGS, *no_timeouts(server_version)]


def pin_target(conn: psycopg.Connection[Any]) -> None:
    """Pin a target session's formats, timeouts and isolation (one round trip)."""
    pin(conn, target_settings(conn.info.server_version))


def pinned_source_conninfo(conninfo: str) -> str:
    """The source DSN of a COPY child: formats and timeouts pinned in ``options``."""
    params = conninfo_to_dict(conninfo)
    ours = " ".join(f"-c {k}={v}" for k, v in (*FORMAT_SETTINGS[1:], *TIMEOUT_SETTINGS))
    opts = f"{params.get('options') or ''} {ours}".strip()  # the last -c of a name wins
    return make_conninfo(conninfo, options=opts, client_encoding="UTF8")


@dataclass(frozen=True)
class ChildConnection:
    """What a psql/pg_dump child is started with: ``--dbname`` text and environment."""

    dbname: str  # a conninfo without any secret
    env: dict[str, str]


_SERVICE = "applier_secrets"


@contextlib.contextmanager
def child_connection(conninfo: str) -> Iterator[ChildConnection]:
    """The connection of a child process; secrets only in its environment or a 0600 file.

    The file (only made for ``sslpassword``) is removed when the block ends:
    keep the block open until the child has connected.
    """
    params = conninfo_to_dict(conninfo)
    env = dict(os.environ)
    password = params.pop("password", None)
    if password is not None:
        env["PGPASSWORD"] = str(password)
    sslpassword = params.pop("sslpassword", None)
    if sslpassword is None:
        yield ChildConnection(make_conninfo("", **params), env)
        return
    if "service" in params or "PGSERVICE" in env or "\n" in str(sslpassword):
        raise BootstrapError(
            "sslpassword cannot be handed to pg_dump/psql together with a service "
            "(or with a line break in it)",
            hint="put sslpassword in your pg_service.conf service instead of the dsn",
        )
    fd, path = tempfile.mkstemp(prefix="applier-pgservice-")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"[{_SERVICE}]\nsslpassword={sslpassword}\n")
        env["PGSERVICEFILE"] = path
        yield ChildConnection(make_conninfo("", **params, service=_SERVICE), env)
    finally:
        os.unlink(path)
