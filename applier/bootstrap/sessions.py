"""How a ``psql``/``pg_dump`` child of the bootstrap gets its connection without
exposing a secret.

Pinned settings
---------------
Every session of the bootstrap, the children's included, is pinned as every
connection applier opens (:mod:`applier.pgconn`): the children get the
settings in their conninfo's ``options`` (:func:`applier.pgconn.pinned_conninfo`),
so a text-format COPY reads back exactly what it wrote whatever the source
database's or role's defaults say, and no timeout kills a long COPY.

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

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..errors import BootstrapError


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
