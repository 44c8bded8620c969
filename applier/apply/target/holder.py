"""Who holds the replication origin when the apply session cannot take it.

``pg_replication_origin_session_setup`` fails with 55006 "replication origin
... is already active for PID n" while another target backend has the origin
set up. Two very different holders answer so:

* **another worker** on the same origin: a manual ``applier run`` beside the
  service, or the same configuration started on a second host. Waiting would
  loop for as long as it runs; it is refused at once with exit 3
  (:class:`~applier.errors.AnotherWorker`), naming that worker.
* **an abandoned backend**: one whose client is gone but which has not
  noticed yet (busy in a statement or a lock wait, or its socket half-open
  until the keepalives expire). Either an earlier session of this process
  (closed after a stall; :mod:`.connection` ends those it can), or the
  previous process on this host, killed or crashed and restarted by systemd.
  It ends by itself, so the worker waits: a :class:`TransientError`, retried.

The worker's row in ``applier.worker_status`` says which (its running worker
writes ``host``, ``pid`` and ``heartbeat_at``, and only a worker that owns
the origin writes them, see :mod:`applier.status.row`). The row names another worker
when its state is ``running``, it is not this very process, and

* on this host: its process still runs and is an applier (a pid reused by
  something else is not). The heartbeat does not matter here: a worker blocked
  in a long statement beats late, and a worker killed a second ago beat fresh.
* on another host: its heartbeat is younger than
  :data:`~applier.status.health.STALE_INTERVALS` status intervals (what ``applier
  status`` calls fresh), since its process cannot be seen from here. A worker
  killed there within that time is taken as running: the refusal is then one
  restart too many, never a second worker.

A row from a worker stopped long ago does not block anything: its backend
is gone, so the origin is free and nothing is asked.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from applier.errors import AnotherWorker, ApplierError, TransientError
from applier.status.health import STALE_INTERVALS

#: SQLSTATE object_in_use: the origin is set up by another session.
OBJECT_IN_USE = "55006"


@dataclass(frozen=True)
class LastWorker:
    """The status row: the worker that last owned the origin."""

    host: str | None
    pid: int | None
    state: str
    heartbeat_age: float | None

    def runs(self, status_interval: float) -> bool:
        """The one rule of "a worker runs" as seen from the row alone (drop, sync-tables,
        and ``applier status`` say it so): its state is running (or starting) and its
        heartbeat is fresher than :data:`~applier.status.health.STALE_INTERVALS` status
        intervals. A worker on this host is told more surely by its process
        (:func:`is_other_worker`)."""
        return (
            self.state in ("running", "starting")
            and self.heartbeat_age is not None
            and self.heartbeat_age <= STALE_INTERVALS * status_interval
        )

    def why_not_running(self, status_interval: float) -> str:
        """Why :meth:`runs` is False, for a refusal's words."""
        if self.state not in ("running", "starting"):
            return f"its state is {self.state}"
        stale = STALE_INTERVALS * status_interval
        return f"its heartbeat is {self.heartbeat_age or 0:.0f} s old (stale after {stale:g} s)"


def is_other_worker(
    last: LastWorker | None,
    here: tuple[str, int],
    stale_after: float,
    alive: Callable[[int], bool],
) -> bool:
    """Whether ``last`` is another worker running now (see the module's docstring)."""
    if last is None or last.host is None or last.pid is None or last.state != "running":
        return False
    if (last.host, last.pid) == here:
        return False  # this process: the holder is an earlier session's backend
    if last.host == here[0]:
        return alive(last.pid)
    return last.heartbeat_age is not None and last.heartbeat_age <= stale_after


def applier_alive(pid: int) -> bool:
    """An applier process ``pid`` runs on this host (a reused pid is not one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    if not Path("/proc/self").exists():
        return True  # no /proc to tell what it is
    try:
        # A zombie (killed, not yet reaped) has an empty command line.
        return b"applier" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False  # gone meanwhile


def holder_pid(message: str) -> int | None:
    """The backend pid of "... is already active for PID n" (the last number:
    it is in translated messages too)."""
    numbers = re.findall(r"\d+", message)
    return int(numbers[-1]) if numbers else None


def origin_taken(
    conn: psycopg.Connection[Any], origin: str, refused: ApplierError, stale_after: float
) -> ApplierError:
    """The error to raise for ``refused`` (55006 from the origin's set-up): another
    worker (permanent) or a wait for an abandoned backend (transient)."""
    bpid = holder_pid(refused.message)
    try:
        backend = _backend(conn, bpid)
        last = last_worker(conn, origin)
    except psycopg.Error:
        return refused  # cannot tell: the wait, as for an abandoned backend
    here = (socket.gethostname(), os.getpid())
    if last is not None and is_other_worker(last, here, stale_after, applier_alive):
        age = "unknown" if last.heartbeat_age is None else f"{last.heartbeat_age:.0f} s ago"
        return AnotherWorker(
            f"another applier worker is running on origin {origin!r}: pid {last.pid} "
            f"on host {last.host}, heartbeat {age}; it holds the origin through target "
            f"backend {bpid}{backend}",
            hint="stop that worker first (systemctl stop applier, or end that process); "
            "a second worker needs its own [target] origin and [source] slot",
        )
    return TransientError(
        f"origin {origin!r} is still held by target backend {bpid}{backend}, "
        f"{_whose(last, here)}; waiting for it to end ({refused.message})",
        hint="a backend whose client is gone ends when it next reads from it, or when "
        "the keepalives expire; applier run retries",
        sqlstate=OBJECT_IN_USE,
    )


def _whose(last: LastWorker | None, here: tuple[str, int]) -> str:
    if last is None or last.pid is None:
        return "and no worker is on record"
    if (last.host, last.pid) == here:
        return "an earlier session of this worker"
    return f"left by worker pid {last.pid} on host {last.host}, which is gone"


def _backend(conn: psycopg.Connection[Any], pid: int | None) -> str:
    """`` (application 'x' from addr:port, since T)`` of backend ``pid``, or ``""``."""
    if pid is None:
        return ""
    row = conn.execute(
        "SELECT application_name, coalesce(pg_catalog.host(client_addr) || ':' || client_port, "
        "'a local socket'), date_trunc('second', backend_start)::text "
        "FROM pg_catalog.pg_stat_activity WHERE pid = %s",
        (pid,),
    ).fetchone()
    if row is None:
        return " (gone now)"
    return f" (application {row[0]!r} from {row[1]}, since {row[2]})"


def last_worker(conn: psycopg.Connection[Any], origin: str) -> LastWorker | None:
    """The origin's status row (None: no worker ever ran on it)."""
    row = conn.execute(
        "SELECT host, pid, state, extract(epoch FROM now() - heartbeat_at)::float8 "
        "FROM applier.worker_status WHERE origin = %s",
        (origin,),
    ).fetchone()
    if row is None:
        return None
    return LastWorker(host=row[0], pid=row[1], state=row[2], heartbeat_age=row[3])
