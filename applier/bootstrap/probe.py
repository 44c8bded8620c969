"""The preflight task: what one Spark executor lacks to run applier's tasks.

It runs on the executors before a command creates anything
(:func:`applier.bootstrap.executors.preflight`), in the executors' own
Python, so it imports only the standard library at the top: psycopg and the
rest of applier are imported once it is known they are there. What it
checks, each a line of its answer:

* the Python modules a task imports (``psycopg``; ``pyspark`` itself the
  worker could not have started without, see :mod:`.spark`'s failures);
* ``psql``/``pg_dump`` of the source's major version or newer, where the job
  runs them (the bootstrap's and sync-tables' copies), picked as a copy task
  picks them (:func:`.clients.pick`);
* a connection to each database with the DSN the tasks use, and a password
  source for it (``fe_sendauth: no password supplied`` is its absence).
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from dataclasses import dataclass, field
from typing import Literal

#: Modules a task imports beyond the standard library and pyspark.
TASK_MODULES = ("psycopg",)


@dataclass(frozen=True)
class Probe:
    """What the executors are asked to check (picklable, sent with the task)."""

    source_conninfo: str = field(repr=False)
    target_conninfo: str = field(repr=False)
    #: The source's major version when the job runs psql/pg_dump, else 0.
    psql_major: int = 0
    client_bin_dir: str | None = None


def check_executor(probe: Probe, _partition: object = None) -> list[tuple[str, str]]:
    """(host, problem) for each thing this executor lacks; none when it has everything."""
    host = socket.gethostname()
    lacking = [m for m in TASK_MODULES if importlib.util.find_spec(m) is None]
    if lacking:
        return [
            (host, f"its Python {sys.executable} lacks the module {m}: pip install "
                   f"'psycopg[binary]' there, or ship an environment with spark.archives")
            for m in lacking
        ]  # fmt: skip
    problems = [_psql(probe)] if probe.psql_major else []
    problems += [
        _reach(probe.source_conninfo, "source"),
        _reach(probe.target_conninfo, "target"),
    ]
    return [(host, p) for p in problems if p]


def _psql(probe: Probe) -> str | None:
    from ..errors import ApplierError
    from .clients import pick

    try:
        pick(probe.source_conninfo, probe.psql_major, probe.client_bin_dir)
    except ApplierError as e:
        return f"{e.message} ({e.hint})" if e.hint else e.message
    return None


def _reach(conninfo: str, side: Literal["source", "target"]) -> str | None:
    import psycopg

    from .. import pgconn
    from ..errors import ApplierError
    from ..redact import redact_dsn

    try:
        pgconn.connect(conninfo, side=side, purpose="applier-preflight", connect_timeout=5).close()
    except (psycopg.Error, ApplierError) as e:
        text = e.message if isinstance(e, ApplierError) else str(e)
        first = (text.strip().splitlines() or [type(e).__name__])[0]
        where = redact_dsn(conninfo)
        if "no password supplied" in text:
            return (
                f"no password for the {side} ({where}): give [{side}] password_file "
                f"(shipped to the executors as a 0600 file) or put a passfile on each "
                f"executor (~/.pgpass, or passfile= in [bootstrap] executor_{side}_dsn)"
            )
        return (
            f"cannot connect to the {side} with {where}: {first} (set [bootstrap] "
            f"executor_{side}_dsn to a DSN the executors reach)"
        )
    return None
