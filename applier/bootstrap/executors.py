"""What the Spark executors get from the driver on a cluster, and the check that they have it.

A local master (``local``, ``local[N]``) runs its tasks in Python workers of
the driver's own machine and interpreter: nothing is shipped. Any other
master has executors on other hosts, with a Python of their own that has
not got applier installed, and cannot see the driver's files. So, there:

Code
    applier's own package goes to them as a zip (``SparkContext.addPyFile``),
    built once per set of sources and kept in the user's cache directory
    (:func:`code_zip`). Its Python files only: the C speedups are built for
    the driver's Python, and nothing a task runs needs them. The modules a
    task imports (:mod:`.copy_task`, :mod:`.probe`, :mod:`applier.verify.job`
    and what they import) take only the standard library, psycopg and
    pyspark: no config validation, CLI or terminal library
    (``tests/bootstrap/test_cluster.py`` imports them with the others
    blocked).
Python
    ``[bootstrap] executor_python`` names the executors' interpreter, else
    the cluster's own is used (:func:`applier.bootstrap.spark.python_of`).
DSNs and passwords
    Tasks connect with ``[bootstrap] executor_source_dsn`` /
    ``executor_target_dsn``, else with the driver's DSNs (:func:`task_dsns`).
    A password the driver holds (in the DSN, ``password_file``,
    ``password_credential``) never goes into SparkConf or a command line: it
    is written to a pgpass file readable by this user only, in a private
    directory, and shipped with the job (``SparkContext.addFile``); the
    task's DSN names it as ``passfile=spark-file:NAME``, which
    :func:`applier.pgconn.local_conninfo` turns into the copy on the
    executor, made 0600 there (libpq ignores a passfile others can read). An
    executor DSN with a ``password`` or ``passfile`` of its own is used as it
    is (a passfile present on each executor); with none, the executors' own
    ``~/.pgpass``, ``PGPASSFILE`` or ``PGPASSWORD`` (a cluster's secret
    mechanism, e.g. Kubernetes' ``secretKeyRef``) apply.
Preflight
    :func:`preflight` runs :func:`.probe.check_executor` on the executors
    before the command creates anything, and refuses (exit 2) with one line
    per missing thing and host.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import logging
import os
import shutil
import tempfile
import uuid
import zipfile
from pathlib import Path
from typing import Any, Literal

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..config import Config, Endpoint
from ..errors import ConfigError
from ..pgconn import SHIPPED
from .probe import Probe, check_executor

log = logging.getLogger(__name__)

Side = Literal["source", "target"]
_PACKAGE = Path(__file__).resolve().parent.parent


def is_local(master: str) -> bool:
    """Whether the master runs tasks in the driver's machine and Python (``local[N]``)."""
    return master == "local" or master.startswith("local[")


# -- code ---------------------------------------------------------------------------------


def _sources() -> list[Path]:
    return sorted(p for p in _PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def code_zip(cache: Path | None = None) -> Path:
    """The zip of applier's Python files, built once per set of sources.

    Named by the version and a digest of every file's path, size and mtime,
    so an edited tree gets a new zip and an unchanged one reuses its file.
    Written under a temporary name and renamed: a reader never sees half.
    """
    from .. import __version__

    files = _sources()
    ident = "\n".join(
        f"{p.relative_to(_PACKAGE)}|{p.stat().st_size}|{p.stat().st_mtime_ns}" for p in files
    )
    digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
    base = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "applier"
    path = base / f"applier-{__version__}-{digest}.zip"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for p in files:
            z.write(p, Path("applier") / p.relative_to(_PACKAGE))
    os.replace(tmp, path)
    return path


def ship_code(sc: Any) -> None:
    """Add applier's zip to the job (once per context: Spark ignores a second add)."""
    sc.addPyFile(str(code_zip()))


# -- DSNs and passwords -----------------------------------------------------------------


@functools.cache
def _secret_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="applier-secrets-"))  # mode 0700
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


#: The secret file shipped for (context, side, password), by its name.
_shipped: dict[tuple[int, str, str], str] = {}


def _ship_password(sc: Any, side: Side, password: str) -> str:
    """The name of a shipped pgpass file holding ``password`` for any server."""
    key = (id(sc), side, password)
    if key not in _shipped:
        name = f"applier-{side}-{uuid.uuid4().hex}.pgpass"
        path = _secret_dir() / name
        escaped = password.replace("\\", "\\\\").replace(":", "\\:")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"*:*:*:*:{escaped}\n")
        sc.addFile(str(path))
        _shipped[key] = name
    return _shipped[key]


def task_dsn(cfg: Config, side: Side, sc: Any) -> str:
    """The DSN the tasks of ``side`` connect with (see the module docstring)."""
    endpoint: Endpoint = cfg.source if side == "source" else cfg.target
    bcfg = cfg.bootstrap
    own = bcfg.executor_source_dsn if side == "source" else bcfg.executor_target_dsn
    driver = endpoint.conninfo()
    params = conninfo_to_dict(driver)
    password = params.pop("password", None)
    if own is not None:
        params = conninfo_to_dict(own)
        if "password" in params or "passfile" in params:
            return own  # the executors' own password source
    if password is None:
        return own or driver
    if is_local(bcfg.spark_master):
        # The driver's own machine: the password travels inside the pickled task.
        return make_conninfo(own, password=password) if own else driver
    passfile = SHIPPED + _ship_password(sc, side, str(password))
    return make_conninfo("", **{**params, "passfile": passfile})


def task_dsns(cfg: Config, sc: Any) -> tuple[str, str]:
    """(source, target) DSNs of the tasks."""
    return task_dsn(cfg, "source", sc), task_dsn(cfg, "target", sc)


# -- preflight ----------------------------------------------------------------------------


def preflight(sc: Any, cfg: Config, job: str, psql_major: int = 0) -> None:
    """Refuse (exit 2) when an executor lacks something ``job`` needs; nothing on a local master.

    One task per task slot, so each executor is likely to run one (Spark
    does not promise it: an executor left out is checked by its first real
    task, whose failure names its host too).
    """
    if is_local(cfg.bootstrap.spark_master):
        return
    from .spark import spark_failure

    src, tgt = task_dsns(cfg, sc)
    probe = Probe(src, tgt, psql_major, cfg.bootstrap.client_bin_dir)
    slots = max(2, int(sc.defaultParallelism))
    sc.setJobGroup(f"applier-{job}-preflight", f"applier {job} preflight")
    try:
        found = (
            sc.parallelize(range(slots), slots)
            .flatMap(functools.partial(check_executor, probe))
            .collect()
        )
    except Exception as e:  # py4j's error of the job: its executor's cause, one line
        raise spark_failure(e, job) from None
    problems = sorted(set(found))
    for host, problem in problems:
        log.error("executor %s: %s", host, problem)
    if problems:
        raise ConfigError(
            f"the Spark executors lack what {job} needs: "
            + "; ".join(f"executor {host}: {problem}" for host, problem in problems),
            hint="install or fix it on every executor (README: Running on a Spark cluster)",
        )
