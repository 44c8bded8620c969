"""The worker's row in ``applier.worker_status`` (what ``applier status`` shows).

Written on its own autocommit connection, never the apply session: the row
must not ride on (or roll back with) an applied transaction, and its commits
must not carry the replication origin. Failing to write it is logged, never
fatal: status is a window, not part of replication.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import asdict
from typing import Any

import psycopg

from applier.errors import ErrorRecord
from applier.lsn import Lsn, pg_timestamp

log = logging.getLogger("applier.apply")


class WorkerState:
    def __init__(self, conn: psycopg.Connection[Any] | None, origin: str, slot: str) -> None:
        self.conn = conn
        self.origin = origin
        self.slot = slot

    def _exec(self, query: str, params: tuple[Any, ...]) -> None:
        if self.conn is None or self.conn.closed:
            return
        try:
            self.conn.execute(query, params)
        except psycopg.Error as e:
            log.warning("cannot update applier.worker_status: %s", str(e).strip())

    def started(self) -> None:
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
        self, applied: int, skipped: int, last_lsn: Lsn | None, last_ts: int | None
    ) -> None:
        self._exec(
            """
            UPDATE applier.worker_status
               SET heartbeat_at = now(), state = 'running', pid = %s,
                   applied_txns = %s, skipped_changes = %s,
                   last_commit_lsn = coalesce(%s::pg_lsn, last_commit_lsn),
                   last_commit_time = coalesce(%s, last_commit_time)
             WHERE origin = %s
            """,
            (
                os.getpid(),
                applied,
                skipped,
                str(last_lsn) if last_lsn else None,
                pg_timestamp(last_ts) if last_ts else None,
                self.origin,
            ),
        )

    def stopped(self) -> None:
        self._exec(
            "UPDATE applier.worker_status SET state = 'stopped', heartbeat_at = now() "
            "WHERE origin = %s",
            (self.origin,),
        )

    def failed(self, exc: BaseException) -> None:
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
