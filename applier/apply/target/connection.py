"""Connections to the target: pinned settings, keepalives, and a bound on silence.

Pinned settings
===============

Every target connection is opened by :func:`applier.pgconn.connect`, which pins
in its startup packet what a role or database default could change under us
(formats, ``search_path``, timeouts, isolation: see that module); this one adds
the server's side of the keepalives (below).

A stalled connection
====================

A connection can stall without any error: a peer gone without a FIN or RST
(a host crash, a dropped NAT or firewall entry, a half-open TCP connection),
or a middlebox that keeps the socket open and forwards nothing. Three layers
find it:

* TCP keepalives on our side (libpq ``keepalives_idle/interval/count``) and
  ``tcp_user_timeout`` (sent data unacknowledged), unless the DSN sets its
  own; and the same settings for the server's side of the socket (the GUCs
  ``tcp_keepalives_*``, ``tcp_user_timeout``), so a backend whose client is gone
  ends and releases the replication origin. These find a dead peer, not a
  middlebox that still acknowledges.
* The pipeline (:mod:`applier.apply.target.pipeline`) bounds the *silence* of the
  socket while results are owed by ``[apply] target_timeout``, not the time a
  statement takes: a COPY run or an index-less FULL-identity UPDATE may run
  for minutes without a byte. When the bound passes, :func:`backend_busy`
  asks the server on a fresh connection whether our backend is still
  executing (``pg_stat_activity``: active and not waiting on its client). If
  it is, the wait goes on; if not, or if the server cannot be reached within
  ``connect_timeout``, the backend is terminated (best effort, so it releases
  the origin) and the socket is shut down: the wait ends with a
  :class:`ConnectionLost` and the worker reconnects.
* Blocking calls through psycopg (catalog look-ups, the flush position, the
  status row, COMMIT PREPARED) have the same bound through
  :class:`GuardedConnection`, whose :class:`Watchdog` thread does the same
  check when one call has waited longer than ``target_timeout``.

Worst case after a stall: ``target_timeout`` + ``connect_timeout`` (10 s) of
the probe, then the worker's retry delay.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from applier import pgconn
from applier.errors import ConnectionLost
from applier.redact import redact_dsn

log = logging.getLogger("applier.apply")

#: Seconds the probe connection (and every target connection) may take to connect.
CONNECT_TIMEOUT = 10
#: Default bound on a silent socket while results are owed ([apply] target_timeout).
DEFAULT_TIMEOUT = 60.0

#: libpq keepalive defaults, used unless the DSN sets them: a dead peer is found
#: after about 10 + 3 * 5 = 25 s of silence.
KEEPALIVES = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5"}
KEEPALIVES_COUNT = "3"


def client_keepalives(conninfo: str, timeout: float) -> str:
    """``conninfo`` with keepalives and ``tcp_user_timeout`` unless it sets them."""
    params = conninfo_to_dict(conninfo)
    extra: dict[str, Any] = {k: v for k, v in KEEPALIVES.items() if k not in params}
    if "keepalives_count" not in params:
        extra["keepalives_count"] = KEEPALIVES_COUNT
    if "tcp_user_timeout" not in params:
        extra["tcp_user_timeout"] = str(int(timeout * 1000))
    return make_conninfo(conninfo, **extra) if extra else conninfo


def server_keepalives(timeout: float) -> dict[str, str]:
    """The server's side of the socket (see "A stalled connection")."""
    return {
        "tcp_keepalives_idle": KEEPALIVES["keepalives_idle"],
        "tcp_keepalives_interval": KEEPALIVES["keepalives_interval"],
        "tcp_keepalives_count": KEEPALIVES_COUNT,
        "tcp_user_timeout": str(int(timeout * 1000)),
    }


def pin(conn: psycopg.Connection[Any], settings: list[tuple[str, str]]) -> None:
    """Set ``settings`` for the session (outside a transaction, or committed by the
    caller: a rolled-back set_config is undone): those that cannot go in the startup
    packet (:mod:`applier.pgconn`), e.g. one that needs a privilege to be set."""
    conn.execute(
        "SELECT pg_catalog.count(pg_catalog.set_config(n, v, false)) "
        "FROM ROWS FROM (pg_catalog.unnest(%s::pg_catalog.text[]), "
        "pg_catalog.unnest(%s::pg_catalog.text[])) AS s(n, v)",
        ([n for n, _ in settings], [v for _, v in settings]),
    )


def backend_busy(conninfo: str, pid: int, terminate: bool) -> str | None:
    """What backend ``pid`` is doing, asked on a fresh connection.

    Returns None when it is executing (active and not waiting on its client:
    silence is legitimate), else a description of why the connection is
    deemed stalled; with ``terminate`` the backend is then terminated (best
    effort), so it releases the replication origin at once.
    """
    try:
        with pgconn.connect(
            conninfo, side="target", purpose="applier probe", connect_timeout=CONNECT_TIMEOUT
        ) as conn:
            row = conn.execute(
                "SELECT state, wait_event_type, wait_event FROM pg_catalog.pg_stat_activity "
                "WHERE pid = %s",
                (pid,),
            ).fetchone()
            if row is None:
                return "its backend is gone"
            state, wait_type, wait_event = row
            if state == "active" and wait_type != "Client":
                return None
            if terminate:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("SELECT pg_catalog.pg_terminate_backend(%s)", (pid,))
            return f"its backend is {state} (waiting on {wait_type}/{wait_event})"
    except psycopg.Error as e:
        return f"the server cannot be reached ({str(e).strip().splitlines()[0]})"


def shut_down(fd: int) -> None:
    """End every wait on socket ``fd`` (both directions): libpq then sees EOF."""
    if fd < 0:
        return
    with contextlib.suppress(OSError):
        s = socket.socket(fileno=os.dup(fd))
        try:
            s.shutdown(socket.SHUT_RDWR)
        finally:
            s.close()


class Watchdog:
    """Bounds the silence of one target connection (see "A stalled connection")."""

    def __init__(self, conninfo: str, timeout: float, what: str) -> None:
        self.conninfo = conninfo
        self.timeout = timeout
        self.what = what
        self.pid = 0
        self.fd = -1
        self._lock = threading.Lock()
        self._since: float | None = None
        self._call = 0  # which blocking call is being watched
        self._fired = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, conn: psycopg.Connection[Any]) -> None:
        self.pid = conn.info.backend_pid
        self.fd = conn.pgconn.socket

    def check(self, silent_for: float) -> None:
        """The socket has been silent ``silent_for`` s while results are owed:
        return if the backend is still executing, else raise :class:`ConnectionLost`."""
        why = backend_busy(self.conninfo, self.pid, terminate=True)
        if why is None:
            log.info(
                "the target is still executing; waiting on",
                extra={"ctx": {"connection": self.what, "silent_s": round(silent_for, 1)}},
            )
            return
        shut_down(self.fd)
        raise self.stalled(silent_for, why)

    def stalled(self, silent_for: float, why: str) -> ConnectionLost:
        return ConnectionLost(
            f"the target {self.what} connection was silent for {silent_for:.0f} s while "
            f"results were owed, and {why}",
            hint="applier run reconnects; [apply] target_timeout bounds this wait",
        )

    # -- blocking calls, watched from a thread ----------------------------------------

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """Watch one blocking call on the connection."""
        if self.pid == 0:
            yield
            return
        with self._lock:
            self._call += 1
            self._since = time.monotonic()
            self._fired = False
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._watch, name=f"applier {self.what} watchdog", daemon=True
            )
            self._thread.start()
        try:
            yield
        except psycopg.OperationalError as e:
            if self._fired:
                raise psycopg.OperationalError(str(self.stalled(self.timeout, str(e)))) from e
            raise
        finally:
            with self._lock:
                self._since = None

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                since, call = self._since, self._call
            if since is None or time.monotonic() - since < self.timeout:
                continue
            why = backend_busy(self.conninfo, self.pid, terminate=True)
            with self._lock:
                if self._since is None or self._call != call:
                    continue  # that call has ended meanwhile
                if why is None:
                    self._since = time.monotonic()  # executing: wait another bound
                    continue
                self._fired = True
            log.warning("the target %s connection stalled (%s); closing it", self.what, why)
            shut_down(self.fd)

    def close(self) -> None:
        self._stop.set()


class GuardedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose blocking waits are bounded by its :class:`Watchdog`."""

    watchdog: Watchdog | None = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        dog = self.watchdog
        if dog is None:
            return super().wait(gen, interval, timeout)
        with dog.blocking():
            return super().wait(gen, interval, timeout)

    #: (pid, backend_start) of its server backend.
    backend: tuple[int, Any] | None = None

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.close()
        if self.backend is not None:
            _closed.append(self.backend)
            self.backend = None
        super().close()


#: Backends of connections this process closed. A stalled connection cannot tell
#: its backend that it closed, and the backend (its peer a middlebox that still
#: acknowledges, or a half-open socket) may live on, holding the replication
#: origin, so the next session could never take it. The next connection ends
#: whichever of them still exists, matched by pid *and* start time, so nothing but
#: our own abandoned backends is touched.
_closed: list[tuple[int, Any]] = []


def _end_abandoned(conn: psycopg.Connection[Any]) -> None:
    if not _closed:
        return
    pids = [pid for pid, _ in _closed]
    starts = [start for _, start in _closed]
    _closed.clear()
    try:
        rows = conn.execute(
            "SELECT a.pid, pg_catalog.pg_terminate_backend(a.pid, 5000) "
            "FROM pg_catalog.pg_stat_activity a "
            "JOIN ROWS FROM (pg_catalog.unnest(%s::pg_catalog.int4[]), "
            "pg_catalog.unnest(%s::pg_catalog.timestamptz[])) AS x(pid, started) "
            "ON a.pid = x.pid AND a.backend_start = x.started",
            (pids, starts),
        ).fetchall()
    except psycopg.OperationalError:
        raise
    except psycopg.Error as e:  # e.g. not allowed to: the server's keepalives will do it
        log.debug("ending abandoned target backends failed: %s", e)
        return
    if rows:
        log.info(
            "ended target backends of abandoned connections",
            extra={"ctx": {"pids": [r[0] for r in rows]}},
        )


def connect(
    conninfo: str, application_name: str, timeout: float = DEFAULT_TIMEOUT, **kw: Any
) -> GuardedConnection:
    """An autocommit target connection: pinned settings (:mod:`applier.pgconn`),
    keepalives on both sides of the socket, a watchdog."""
    ci = client_keepalives(conninfo, timeout)
    # psycopg's own automatic preparation stays off: it answers a ROLLBACK (and a
    # ROLLBACK PREPARED) with DEALLOCATE ALL, which would drop the session's
    # statements too (issue 12, item 19).
    kw.setdefault("prepare_threshold", None)
    try:
        conn: GuardedConnection = pgconn.connect(
            ci, side="target", purpose=application_name, connect_timeout=CONNECT_TIMEOUT,
            extra=server_keepalives(timeout), connection_class=GuardedConnection, **kw,
        )  # fmt: skip
    except psycopg.OperationalError as e:  # a refusal raised ConnectRefused (pgconn)
        raise ConnectionLost(
            f"cannot connect to the target ({redact_dsn(conninfo)}): {str(e).strip()}",
            hint="check [target] dsn and that the server is up; applier run retries",
        ) from None
    try:
        row = conn.execute(
            "SELECT backend_start FROM pg_catalog.pg_stat_activity "
            "WHERE pid = pg_catalog.pg_backend_pid()"
        ).fetchone()
        _end_abandoned(conn)
    except psycopg.OperationalError as e:
        conn.close()
        raise ConnectionLost(f"setting up a target connection: {str(e).strip()}") from None
    conn.backend = (conn.info.backend_pid, row[0] if row else None)
    dog = Watchdog(ci, timeout, application_name.removeprefix("applier "))
    dog.attach(conn)
    conn.watchdog = dog
    return conn


def session_settings(synchronous_commit: str) -> list[tuple[str, str]]:
    """The apply session's own settings (applier.apply.target.session, "Target
    session"); the formats, search_path, timeouts and isolation come with every
    connection (pgconn)."""
    return [
        ("session_replication_role", "replica"),
        ("synchronous_commit", synchronous_commit),
    ]
