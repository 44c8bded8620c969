"""The SparkContext of a bootstrap, built from ``[bootstrap]``, and its life in a command.

On a local master the Python workers run our interpreter (they import
``applier`` to run the copy tasks), so ``PYSPARK_PYTHON`` defaults to
``sys.executable``; on a cluster that path means nothing to another host: the
executors run ``[bootstrap] executor_python`` or the cluster's own Python, and
get applier's code from the driver (:mod:`.executors`). Task
retries are safe (a slice's data and done-record commit together), so local
masters get a retry count too: ``local[N]`` alone never retries a task.

The driver JVM only schedules tasks (no row goes through it), so unless
``spark_conf`` sets ``spark.driver.extraJavaOptions`` it runs with the C1
compiler only and the serial GC: fewer threads competing for the cores at
start-up, which on a small machine shortens the Spark start (measured on
2 busy vCPUs, 3 interleaved runs: median 12.8 s -> 10.1 s).

Most of what is left of the start-up is the JVM loading and verifying some
ten thousand classes. A *class archive* (the JVM's class-data sharing, a
dynamic archive written by ``-XX:ArchiveClassesAtExit``) holds them parsed
and verified: ``applier spark-archive`` writes one once (``scripts/setup``
does), and every start after maps it (measured on 2 vCPUs: 3.7 s ->
1.6 s). The JVM checks that the archive matches its own build and class
path and ignores it otherwise; a damaged file can crash it instead, so the
archive is only ever renamed into place complete, and a context that fails
to start with it is started again without it (and the archive removed).

The commands that run Spark jobs (``bootstrap``, ``sync-tables``, ``verify``)
share the rest: :class:`SparkStarter` builds the context in a thread, so the
JVM boots while the driver makes the slot and the tables, and can be
abandoned at once on an error, and runs the executors' preflight
(:func:`.executors.preflight`); :func:`start_spark` turns a failed start into a
:class:`~applier.errors.BootstrapError` naming the master and ships applier's
code to a cluster; :func:`copy_slots` says how many tasks run at once;
:func:`stop_spark` leaves a context the tests share running;
:func:`spark_failure` makes one line of a failed job, naming the job and the
executor's own cause (py4j's "An error occurred while calling ..." is no
cause).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..config import BootstrapConfig, Config
from ..errors import ApplierError, BootstrapError, ConfigError

log = logging.getLogger(__name__)


def master_with_retries(master: str, retries: int = 3) -> str:
    if master.startswith("local[") and "," not in master:
        return f"{master[:-1]},{retries}]"
    return master


def _has_blank(path: Path | str) -> bool:
    # Spark splits extraJavaOptions on blanks: a path with one cannot be passed.
    return any(c.isspace() for c in str(path))


_LOG4J = Path(__file__).with_name("spark-log4j2.properties")

#: JVM options of the driver (see the module docstring); Spark's own logging
#: is cut down to errors (``spark-log4j2.properties``).
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" + (
    "" if _has_blank(_LOG4J) else f" -Dlog4j2.configurationFile={_LOG4J}"
)

#: With an archive: use it if it matches, silently run without it if not.
_SHARE_OPTIONS = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"

_JAVA_OPTS_KEY = "spark.driver.extraJavaOptions"


def default_archive_path() -> Path:
    """Per user, per pyspark and Java install: ``~/.cache/applier/spark-<ver>-<hash>.jsa``."""
    import pyspark

    java = shutil.which("java") or ""
    home = os.environ.get("JAVA_HOME", "")
    ident = f"{Path(pyspark.__file__).parent}|{os.path.realpath(java)}|{home}"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "applier" / f"spark-{pyspark.__version__}-{digest}.jsa"


def archive_path(bcfg: BootstrapConfig) -> Path | None:
    """Where the class archive of this config lives; None when turned off."""
    if bcfg.class_archive == "off":
        return None
    if bcfg.class_archive == "auto":
        return default_archive_path()
    return Path(bcfg.class_archive)


def _usable_archive(bcfg: BootstrapConfig) -> Path | None:
    if _JAVA_OPTS_KEY in bcfg.spark_conf:  # the user's JVM options win
        return None
    path = archive_path(bcfg)
    if path is None or not path.is_file() or _has_blank(path):
        return None
    return path


def _set_python(bcfg: BootstrapConfig) -> None:
    """The executors' Python, read by pyspark when the context starts (``PYSPARK_PYTHON``)."""
    from .executors import is_local

    if is_local(bcfg.spark_master):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    elif bcfg.executor_python is not None:
        os.environ["PYSPARK_PYTHON"] = bcfg.executor_python
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def _conf(bcfg: BootstrapConfig, java_options: str) -> Any:
    _set_python(bcfg)
    from pyspark import SparkConf

    conf = (
        SparkConf()
        .setMaster(master_with_retries(bcfg.spark_master))
        .setAppName("applier-bootstrap")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.ui.enabled", "false")
        .set(_JAVA_OPTS_KEY, java_options)
    )
    for key, value in bcfg.spark_conf.items():
        conf.set(key, value)
    return conf


def build_context(bcfg: BootstrapConfig) -> Any:
    """The SparkContext of a bootstrap (an existing one in this process is reused)."""
    archive = _usable_archive(bcfg)
    if archive is not None:
        # A JVM that crashes on the archive writes its report to the temp
        # directory, not into the user's working directory.
        crash = str(Path(tempfile.gettempdir()) / "applier-spark-hs_err_pid%p.log")
        options = f"{DRIVER_JAVA_OPTIONS} -XX:SharedArchiveFile={archive} {_SHARE_OPTIONS}"
        if not _has_blank(crash):
            options += f" -XX:ErrorFile={crash}"
        try:
            return _started(_conf(bcfg, options))
        except Exception as e:
            log.warning(
                "Spark did not start with the class archive; removed it, starting without",
                extra={"ctx": {"archive": str(archive), "error": str(e).splitlines()[0][:200]}},
            )
            archive.unlink(missing_ok=True)
    return _started(_conf(bcfg, DRIVER_JAVA_OPTIONS))


def _started(conf: Any) -> Any:
    # A SparkContext, not a SparkSession: the copy is RDD work only, and a
    # session's SQL side costs ~0.6 s more to start (1.34 s vs 1.99 s,
    # medians of 3, with the class archive).
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None or SparkContext._gateway is not None:
        sc = SparkContext.getOrCreate(conf)  # this process's JVM is up already
    else:
        sc = SparkContext(conf=conf, gateway=_launch_gateway(conf))
    sc.setLogLevel("ERROR")
    return sc


#: What the JVM prints on stderr that is no news to the user. Spark's launcher
#: always adds ``--add-modules=jdk.incubator.vector`` (JavaModuleOptions), and
#: the JVM then warns "Using incubator modules" at every start; no JVM option
#: turns that off (the module system prints it itself).
_JVM_NOISE = (b"WARNING: Using incubator modules:",)


def _launch_gateway(conf: Any) -> Any:
    """pyspark's JVM, with its stderr copied to ours without :data:`_JVM_NOISE`.

    The copy runs before the JVM starts, so nothing it says is lost, not
    even the reason it failed to start. Its Python workers inherit the pipe.
    """
    from pyspark.java_gateway import launch_gateway

    read_fd, write_fd = os.pipe()
    threading.Thread(target=_copy_stderr, args=(read_fd,), name="spark-stderr", daemon=True).start()
    try:
        return launch_gateway(conf, popen_kwargs={"stderr": write_fd})  # type: ignore[no-untyped-call]
    finally:
        os.close(write_fd)  # the JVM holds its own copy: EOF when it exits


def _copy_stderr(read_fd: int) -> None:
    with os.fdopen(read_fd, "rb") as jvm_stderr:
        for line in jvm_stderr:
            if not line.startswith(_JVM_NOISE):
                _write_all(2, line)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def context_uses_archive(bcfg: BootstrapConfig) -> bool:
    return _usable_archive(bcfg) is not None


def build_class_archive(bcfg: BootstrapConfig) -> Path:
    """Start Spark once with ``-XX:ArchiveClassesAtExit``, run a task, exit: write the archive.

    The JVM writes the archive as it exits, so this waits for the JVM process
    to end, then renames the file into place (a reader never sees half of it).
    """
    path = archive_path(bcfg)
    if path is None:
        raise BootstrapError(
            'bootstrap.class_archive is "off"',
            hint='set it to "auto" or to a file path to build an archive',
        )
    if _JAVA_OPTS_KEY in bcfg.spark_conf:
        raise BootstrapError(
            f"spark_conf sets {_JAVA_OPTS_KEY}, so the class archive would not be used",
            hint=f"add -XX:SharedArchiveFile=... to your {_JAVA_OPTS_KEY} instead",
        )
    if _has_blank(path):
        raise BootstrapError(
            f"the class archive path {path} contains a blank, which Spark cannot pass to Java",
            hint="set bootstrap.class_archive to a path without blanks",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    options = f"{DRIVER_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={tmp} {_SHARE_OPTIONS}"
    try:
        sc = _started(_conf(bcfg, options))
    except Exception as e:
        raise BootstrapError(
            f"cannot start Spark to write a class archive: {str(e).splitlines()[0][:200]}",
            hint="check that Java is 13 or newer (`java -version`) and that Spark starts",
        ) from None
    try:
        # A task too, so the classes of running Python tasks are archived.
        sc.parallelize(range(2), 2).map(str).collect()
        proc = sc._gateway.proc  # the JVM that pyspark launched
    finally:
        sc.stop()
    proc.stdin.close()  # the gateway exits on EOF, and the JVM writes the archive
    proc.wait(timeout=300)
    if not tmp.is_file() or tmp.stat().st_size == 0:
        tmp.unlink(missing_ok=True)
        raise BootstrapError(
            f"the JVM exited without writing a class archive (exit code {proc.returncode})",
            hint="check that Java is 13 or newer (`java -version`)",
        )
    os.replace(tmp, path)
    return path


# -- one command's context: started, sized, stopped; its job's failures -------------


_PY_ERR = re.compile(
    r"^(?:applier\.[\w.]+\.\w+|psycopg\.[\w.]+|\w+Error|\w+Exception): (.+)$", re.MULTILINE
)
#: Where Spark says a task failed: "Lost task 0.3 in stage 1.0 (TID 7) (HOST executor 1)".
_TASK_HOST = re.compile(r"\(TID \d+\) \(([^\s()]+) executor ([^\s()]+)\)")
#: An executor that cannot start the configured Python.
_NO_PYTHON = re.compile(r'Cannot run program "([^"]+)"')
_NO_MODULE = re.compile(r"No module named '([\w.]+)'")
#: The failed task's own exception when it was no Python error (Spark's, Java's).
_TASK_CAUSE = re.compile(r"most recent failure: Lost task [^:]*\): (.+)")

#: What to do after a failed job, by command.
_RERUN = {
    "bootstrap": "fix the cause and rerun `applier bootstrap` (it starts the copy over)",
    "sync-tables": "fix the cause and rerun `applier sync-tables` (it copies the table again)",
    "verify": "fix the cause and rerun `applier verify`",
}
_SETUP = "README: Running on a Spark cluster"


def spark_failure(exc: BaseException, job: str = "bootstrap") -> ApplierError:
    """One line out of a failed Spark job of ``job``: the failed task's own cause and host.

    An executor that lacks what every task needs (its Python, a module) is a
    configuration error (exit 2) saying what to install; any other cause is
    the task's error, with what to rerun.
    """
    if isinstance(exc, ApplierError):
        return exc
    text = str(exc)
    host = _TASK_HOST.search(text)
    # A local master's tasks run in the "driver" executor: no other host to name.
    on = f" on executor {host.group(1)}" if host and host.group(2) != "driver" else ""
    if m := _NO_PYTHON.search(text):
        return ConfigError(
            f"the Spark {job} job failed: the executors{on} cannot run Python {m.group(1)}",
            hint="set [bootstrap] executor_python to the executors' Python, which needs "
            f"pyspark and psycopg ({_SETUP})",
        )
    if m := _NO_MODULE.search(text):
        return ConfigError(
            f"the Spark {job} job failed: the executors' Python{on} lacks the module {m.group(1)}",
            hint=f"install pyspark and psycopg[binary] in it, or ship a packed environment "
            f"with spark.archives ({_SETUP})",
        )
    return BootstrapError(
        f"the Spark {job} job failed{on}: {_cause(text)}",
        hint=_RERUN.get(job, "fix the cause and rerun the command"),
    )


def _cause(text: str) -> str:
    """The last Python error of the failed task, else its Java exception, else the
    first line that is not py4j's "An error occurred while calling ..." (no cause)."""
    if found := _PY_ERR.findall(text):
        return str(found[-1]).strip()
    if task := _TASK_CAUSE.search(text):
        return task.group(1).strip()[:300]
    lines = [ln for ln in text.strip().splitlines() if "An error occurred while calling" not in ln]
    return (lines or ["?"])[0].strip(": ")[:300]


class SparkStarter:
    """Builds the SparkContext in a thread once :meth:`start` is called: the one
    background starter of bootstrap, sync-tables and verify.

    :meth:`context` starts it if needed and waits for it; :meth:`ready` says,
    without waiting, whether it is up (verify hands Spark the ranges its driver
    threads have not started then). With ``check_on_start`` a cluster's
    executors are checked (:meth:`preflight`) in the same thread, as soon as
    Spark is up. :meth:`stop` and :meth:`abandon` may be called any number of
    times; a JVM still booting when it is abandoned is stopped by its thread once
    up (or dies with this process: pyspark's JVM watches its stdin).
    """

    def __init__(self, cfg: Config, job: str = "bootstrap", check_on_start: bool = False) -> None:
        self._cfg = cfg
        self._job = job
        self._check_on_start = check_on_start
        self._checked = False
        self._sc: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def start(self) -> SparkStarter:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="spark-start", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        try:
            sc = start_spark(self._cfg)
        except BaseException as e:  # re-raised by context()
            self._error = e
            return
        with self._lock:
            if self._stopped:  # abandoned while it booted
                stop_spark(sc)
                return
            self._sc = sc
        if self._check_on_start:
            try:
                self._check(sc)
            except BaseException as e:  # re-raised by context()
                self._error = e

    def ready(self) -> bool:
        """Up (or failed to start: :meth:`context` raises), without waiting."""
        return self._thread is not None and not self._thread.is_alive()

    def context(self) -> Any:
        self.start()
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sc

    def preflight(self, psql_major: int = 0) -> None:
        """On a cluster: start Spark, wait for it, check the executors (once).

        Called before the command creates anything; a no-op on a local master,
        whose executors are this process's machine and Python, checked already.
        """
        self._check(self.context(), psql_major)

    def _check(self, sc: Any, psql_major: int = 0) -> None:
        from .executors import is_local, preflight

        if self._checked or is_local(self._cfg.bootstrap.spark_master):
            return
        preflight(sc, self._cfg, self._job, psql_major)
        self._checked = True

    def stop(self, wait: bool = True) -> None:
        """Stop Spark; without ``wait``, one still booting is stopped by its thread once up."""
        if self._thread is None:
            return
        if wait:
            self._thread.join()
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            sc, self._sc = self._sc, None
        if sc is not None:
            stop_spark(sc)

    def abandon(self) -> None:
        """On an error: stop Spark if it is up, without waiting for a JVM still booting,
        so a bad-input error is reported at once."""
        self.stop(wait=False)


def start_spark(cfg: Config) -> Any:
    """A SparkContext for ``cfg``'s master (logged with how long it took to start);
    a failed start is a BootstrapError naming the master."""
    started = time.monotonic()
    try:
        sc = build_context(cfg.bootstrap)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BootstrapError(
            f"cannot start Spark (master {cfg.bootstrap.spark_master}): {first}",
            hint="check bootstrap.spark_master / spark_conf, Java and pyspark",
        ) from None
    from .executors import is_local, ship_code

    if not is_local(cfg.bootstrap.spark_master):
        ship_code(sc)
    log.info(
        "spark started",
        extra={
            "ctx": {
                "master": cfg.bootstrap.spark_master,
                "parallelism": sc.defaultParallelism,
                # After the start: a start that failed with the archive removed it.
                "class_archive": context_uses_archive(cfg.bootstrap),
                "seconds": round(time.monotonic() - started, 1),
            }
        },
    )
    return sc


def copy_slots(cfg: Config, sc: Any) -> int:
    """Copies at once: Spark's task slots (cores of local[N], executors' cores),
    capped by ``[bootstrap] parallelism``."""
    try:
        slots = max(1, int(sc.defaultParallelism))
    except Exception:  # a context without the usual attributes: no alignment
        slots = 1
    return min(slots, cfg.bootstrap.parallelism or slots)


def stop_spark(sc: Any) -> None:
    """Stop ``sc``, unless the tests marked it to be shared (``_applier_keep``)."""
    # Tests share one context across bootstraps; a CLI run ends the JVM anyway.
    if not getattr(sc, "_applier_keep", False):
        sc.stop()
