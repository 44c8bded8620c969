"""A Spark standalone cluster for the tests: a master and workers from Spark's own launcher.

The workers run with an environment a cluster user would build from the
README ("Running on a Spark cluster"): a venv made with ``python -m venv``
and ``pip install pyspark==<the driver's> psycopg[binary]``, without applier;
Spark itself is that venv's pyspark. Where a mount namespace can be made
(``unshare -m``, root), the driver's venv and source tree are hidden from the
workers and everything they start under empty tmpfs mounts, as on another
host. Everything listens on 127.0.0.1.

Every process is started in a session of its own and killed by its group at
the end, also when the test fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pyspark

ROOT = Path(__file__).resolve().parents[2]


_SMALL_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "applier-tests"


def executor_venv() -> Path:
    """The executors' venv (built once per Python, pyspark and psycopg version)."""
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-spark{pyspark.__version__}"
    path = _cache() / f"executor-venv-{tag}-psycopg{psycopg.__version__}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / "ok").exists():
            shutil.rmtree(path, ignore_errors=True)
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", str(path)], check=True)
            subprocess.run(
                [str(path / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                 f"pyspark=={pyspark.__version__}", f"psycopg[binary]=={psycopg.__version__}"],
                check=True, env={**os.environ, "PIP_NO_INPUT": "1"},
            )  # fmt: skip
            (path / "ok").touch()
    return path


def venv_without_psycopg(full: Path) -> Path:
    """A venv that has pyspark (linked from ``full``) but not psycopg."""
    path = full.with_name(full.name + "-nopsycopg")
    if not (path / "bin" / "python").exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True)
        (site,) = (path / "lib").glob("python*/site-packages")
        (src,) = (full / "lib").glob("python*/site-packages")
        for name in ("pyspark", "py4j"):
            (site / name).symlink_to(src / name)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def can_hide() -> bool:
    """Whether processes can be started in a mount namespace of their own."""
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "-m", "--propagation", "private", "true"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


@dataclass
class SparkCluster:
    venv: Path
    workdir: Path
    hidden: list[Path]
    workers: int = 2
    master_url: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    @property
    def spark_home(self) -> Path:
        (site,) = (self.venv / "lib").glob("python*/site-packages")
        return site / "pyspark"

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def _env(self) -> dict[str, str]:
        keep = ("JAVA_HOME", "HOME", "LANG", "TMPDIR")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env.update(
            PATH="/usr/local/bin:/usr/bin:/bin",
            SPARK_HOME=str(self.spark_home),
            SPARK_DAEMON_MEMORY="256m",
            # The driver's own choice (applier.bootstrap.spark): C1 only and the serial
            # GC, fewer threads at start-up on a small machine.
            SPARK_DAEMON_JAVA_OPTS=_SMALL_JVM,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_WORKER_DIR=str(self.workdir / "work"),
            SPARK_LOG_DIR=str(self.workdir / "logs"),
            SPARK_NO_DAEMONIZE="1",
        )
        return env

    def _start(self, name: str, *args: str) -> None:
        cmd = [str(self.spark_home / "bin" / "spark-class"), *args]
        if self.hidden:
            # An empty tmpfs over each hidden directory, in this process tree only.
            mounts = "; ".join(f"mount -t tmpfs -o size=1m applier-hidden {d}" for d in self.hidden)
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                   f'{mounts}; exec "$@"', "sh", *cmd]  # fmt: skip
        log = self.workdir / f"{name}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=self._env(),
                cwd=self.workdir, start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)

    def start(self) -> SparkCluster:
        (self.workdir / "work").mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.master_url = f"spark://127.0.0.1:{port}"
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(port), "--webui-port", str(_free_port()))  # fmt: skip
        self._wait(self.logs[0], "I have been elected leader")
        for i in range(self.workers):
            self._start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.master_url,
                        "--host", "127.0.0.1", "--cores", "1", "--memory", "768m",
                        "--webui-port", str(_free_port()),
                        "--work-dir", str(self.workdir / "work"))  # fmt: skip
        for log in self.logs[1:]:
            self._wait(log, "Successfully registered with master")
        return self

    def _wait(self, log: Path, line: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while line not in log.read_text(errors="replace"):
            if any(p.poll() is not None for p in self.procs) or time.monotonic() > deadline:
                raise AssertionError(f"{log.name}: no {line!r}:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` with its executor and the executor's Python workers."""
        p = self.procs[1 + i]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the launcher, the JVM, executors, Python
        for p in self.procs:
            p.wait(30)

    def spark_conf(self) -> dict[str, str]:
        """What the driver of a test command sets: small executors, loopback only."""
        return {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": str(self.workers),
            "spark.executor.extraJavaOptions": _SMALL_JVM,
        }


@contextlib.contextmanager
def spark_cluster(workdir: Path) -> Iterator[SparkCluster]:
    hidden = [ROOT, Path(sys.prefix)] if can_hide() else []
    cluster = SparkCluster(executor_venv(), workdir, hidden=hidden)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
