"""The worker's row in ``applier.worker_status`` (what ``applier status`` shows).

Written on its own autocommit connection, never the apply session: the row
must not ride on (or roll back with) an applied transaction, and its commits
must not carry the replication origin. Failing to write it is logged, never
fatal: status is a window, not part of replication.

The connection outlives the apply sessions, so it breaks with them (a target
restart, a terminated backend). A write on a broken connection drops it, and
the next write (the next heartbeat, the retry's error record) opens a new one
with ``reopen``; otherwise the row would freeze at the first fault, showing
"running" with a stale heartbeat and no error. While the target is down a
reopen fails fast (connection refused) and is logged once until it works.

Whose row
=========

The row names the worker that owns the origin: a second ``applier run``
reads its host, pid and heartbeat to tell another worker from an abandoned
backend (:mod:`applier.apply.target.holder`). So a worker writes its host and pid only once it
has taken the origin (:meth:`WorkerState.claim`); before that, a retried
error is recorded in ``last_error`` alone, and a refusal because another
worker runs (:class:`~applier.errors.AnotherWorker`) not at all: the row is
that worker's.

Two threads write it: the apply loop (heartbeat) and the reporter (the lag,
:mod:`applier.apply.beat`); a lock takes their statements one at a time. The
reporter writes only once the row is claimed.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import psycopg

from applier.errors import AnotherWorker, ApplierError, ErrorRecord
from applier.lsn import Lsn, pg_timestamp
from applier.pgconn import close_quietly

log = logging.getLogger("applier.apply")


class WorkerState:
    def __init__(
        self,
        conn: psycopg.Connection[Any] | None,
        origin: str,
        slot: str,
        reopen: Callable[[], psycopg.Connection[Any]] | None = None,
    ) -> None:
        self.conn = conn
        self.origin = origin
        self.slot = slot
        self._reopen = reopen
        #: This process owns the origin (has written its host and pid); see "Whose row".
        self.claimed = False
        self._reopen_failed = False
        self._lock = threading.RLock()  # close() from inside a write too

    def _usable(self) -> psycopg.Connection[Any] | None:
        conn = self.conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if self._reopen is None:
            return None
        self.close()
        try:
            self.conn = self._reopen()
        except ApplierError as e:  # the target is still down: the next write tries again
            # Once per outage: the retries come as often as every second.
            (log.debug if self._reopen_failed else log.warning)(
                "cannot reopen the status connection: %s", e
            )
            self._reopen_failed = True
            return None
        self._reopen_failed = False
        log.info("status connection reopened")
        return self.conn

    def _exec(self, query: str, params: tuple[Any, ...]) -> None:
        with self._lock:
            self._exec_locked(query, params)

    def _exec_locked(self, query: str, params: tuple[Any, ...]) -> None:
        for _ in range(2):  # once more on a fresh connection if this one just broke
            conn = self._usable()
            if conn is None:
                return
            try:
                conn.execute(query, params)
                return
            except psycopg.Error as e:
                log.warning("cannot update applier.worker_status: %s", str(e).strip())
                if not (conn.closed or conn.broken):
                    return

    def close(self) -> None:
        with self._lock:
            conn, self.conn = self.conn, None
            if conn is not None:
                close_quietly(conn, "status")

    def claim(self) -> None:
        """This process took the origin: the row is its own from now on (once)."""
        if not self.claimed:
            self.started()

    def started(self) -> None:
        self.claimed = True
        self._exec(
            """
            INSERT INTO applier.worker_status AS w
                   (origin, slot, pid, host, state, started_at, heartbeat_at)
            VALUES (%s, %s, %s, %s, 'running', now(), now())
            ON CONFLICT (origin) DO UPDATE
               SET slot = excluded.slot, pid = excluded.pid, host = excluded.host,
                   state = 'running', started_at = now(), heartbeat_at = now()
            """,
            (self.origin, self.slot, os.getpid(), socket.gethostname()),
        )

    def heartbeat(
        self,
        applied: int,
        skipped: int,
        last_lsn: Lsn | None,
        last_ts: int | None,
        parallel: dict[str, int] | None = None,
    ) -> None:
        """``parallel``: the pool's figures with ``[apply] workers`` > 1 (migration 0013)."""
        self._exec(
            """
            UPDATE applier.worker_status
               SET heartbeat_at = now(), state = 'running', pid = %s, host = %s,
                   applied_txns = %s, skipped_changes = %s,
                   last_commit_lsn = coalesce(%s::pg_lsn, last_commit_lsn),
                   last_commit_time = coalesce(%s, last_commit_time),
                   parallel = %s::jsonb
             WHERE origin = %s
            """,
            (
                os.getpid(),
                socket.gethostname(),
                applied,
                skipped,
                str(last_lsn) if last_lsn else None,
                pg_timestamp(last_ts) if last_ts else None,
                None if parallel is None else json.dumps(parallel),
                self.origin,
            ),
        )

    def lag(self, pending_since: dt.datetime | None) -> None:
        """The lag as the worker measures it now (:mod:`applier.lag`): the commit time
        of the oldest source transaction received and not applied, None if none."""
        if not self.claimed:
            return  # the row is another worker's, or nobody's yet (see "Whose row")
        self._exec(
            "UPDATE applier.worker_status SET lag_at = now(), pending_since = %s WHERE origin = %s",
            (pending_since, self.origin),
        )

    def stopped(self) -> None:
        if not self.claimed:
            return  # stopped before taking the origin: the row is not ours (see "Whose row")
        self._exec(
            "UPDATE applier.worker_status SET state = 'stopped', heartbeat_at = now() "
            "WHERE origin = %s",
            (self.origin,),
        )

    def failed(self, exc: BaseException) -> None:
        if isinstance(exc, AnotherWorker):
            return  # the row is the running worker's (see "Whose row")
        if not self.claimed:
            self.started()  # failed before taking the origin: still this worker's end
        record = json.dumps(asdict(ErrorRecord.from_exc(exc)))
        self._exec(
            """
            UPDATE applier.worker_status
               SET state = 'error', heartbeat_at = now(), last_error = %s::jsonb,
                   last_error_at = now()
             WHERE origin = %s
            """,
            (record, self.origin),
        )

    def retrying(self, exc: BaseException) -> None:
        """A transient error the worker is retrying: still running, the error shown
        (only the error before the origin is taken: see "Whose row")."""
        record = json.dumps(asdict(ErrorRecord.from_exc(exc)))
        if not self.claimed:
            self._exec(
                "UPDATE applier.worker_status SET last_error = %s::jsonb, "
                "last_error_at = now() WHERE origin = %s",
                (record, self.origin),
            )
            return
        self._exec(
            """
            UPDATE applier.worker_status
               SET state = 'running', heartbeat_at = now(), pid = %s,
                   last_error = %s::jsonb, last_error_at = now()
             WHERE origin = %s
            """,
            (os.getpid(), record, self.origin),
        )
