"""Replication origin progress on the target and the flush position we report.

LSN tracking and feedback
=========================

Three positions matter:

* the origin's progress on the target: the source ``end_lsn`` of the last
  transaction applied, written atomically with that transaction's commit by
  ``pg_replication_origin_xact_setup`` (PostgreSQL stores it in the commit
  record). It is the only truth for restart: a restarted worker streams from
  it and the walsender never re-sends a transaction whose commit lies before
  it.
* the local commit position of each applied transaction: where its commit
  record ends in the *target's* WAL.
* the flush position we report to the slot: only a source position whose
  local commit is durably flushed on the target. With ``synchronous_commit``
  off a commit returns before its WAL is flushed; were we to confirm it and
  the target crashed, the slot would have moved past a transaction the target
  lost. :class:`FlushTracker` is worker.c's ``lsn_mapping`` list
  (``store_flush_position``/``get_flush_position``): (remote end, local end)
  pairs, released once ``pg_current_wal_flush_lsn()`` passes the local end.

When nothing is pending (no pairs left, no transaction in hand) the worker
confirms the stream's last received ``wal_end`` so the slot advances through
idle periods and through transactions that had nothing for us.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import psycopg

from applier.lsn import Lsn

log = logging.getLogger("applier.apply")

#: Local LSN meaning "flushed already" (synchronous commit, empty transaction).
FLUSHED = Lsn(0)
#: Local LSN of a commit whose result has not come yet: never flushed.
PENDING = Lsn(2**64 - 1)


class FlushTracker:
    """(remote end_lsn, local commit lsn) pairs in commit order.

    A commit sent but not yet answered (the session pipelines commits, see
    :mod:`applier.apply.target.session`) is stored at once with an unknown local
    position, :data:`PENDING`, and resolved when its result arrives; pairs are
    released strictly in order, so nothing behind an unanswered commit is
    confirmed before it.
    """

    def __init__(self) -> None:
        self._pairs: deque[list[Lsn]] = deque()
        self.flushed_remote = Lsn(0)

    def store(self, remote_end: Lsn, local_end: Lsn) -> None:
        """Record an applied (or empty) transaction; ``local_end`` 0 when already durable."""
        if local_end == FLUSHED and not self._pairs:
            if remote_end > self.flushed_remote:
                self.flushed_remote = Lsn(remote_end)
            return
        self._pairs.append([Lsn(remote_end), Lsn(local_end)])

    def store_pending(self, remote_end: Lsn) -> list[Lsn]:
        """Record a commit whose result has not come yet; see :meth:`resolve`."""
        entry = [Lsn(remote_end), PENDING]
        self._pairs.append(entry)
        return entry

    @staticmethod
    def resolve(entry: list[Lsn], local_end: Lsn) -> None:
        """The commit of ``entry`` succeeded, its commit record ending at ``local_end``."""
        entry[1] = Lsn(local_end)

    def release(self, local_flush: Lsn) -> Lsn:
        """Forget pairs flushed locally; return the highest remote position now durable."""
        pairs = self._pairs
        while pairs and pairs[0][1] <= local_flush:
            remote, _ = pairs.popleft()
            if remote > self.flushed_remote:
                self.flushed_remote = remote
        return self.flushed_remote

    @property
    def pending(self) -> bool:
        return bool(self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)


def session_progress(conn: psycopg.Connection[Any]) -> Lsn:
    """The progress of the origin set up in ``conn``'s session."""
    row = conn.execute(
        "SELECT pg_catalog.pg_replication_origin_session_progress(false)::text"
    ).fetchone()
    return Lsn.parse(str(row[0])) if row and row[0] is not None else Lsn(0)


def rewind(conn: psycopg.Connection[Any], origin: str, committed: Lsn) -> None:
    """Undo an advance of ``conn``'s origin by a transaction that did not commit.

    An abort record after the stamp advances the origin past a transaction
    that did not commit (see "Origin stamp" in :mod:`.session`). The built-in
    worker resets its origin state in its error path; from outside we put the
    progress back to the last commit known to have succeeded (``committed``:
    ``pg_replication_origin_advance`` may go backwards, and is WAL-logged after
    the abort record, so a crash replays both in order).
    """
    position = session_progress(conn)
    if position <= committed:
        return
    log.warning(
        "a failed transaction moved the origin forward; putting it back",
        extra={"ctx": {"origin": origin, "moved_to": position, "back_to": committed}},
    )
    conn.execute("SELECT pg_catalog.pg_replication_origin_session_reset()")
    conn.execute(
        "SELECT pg_catalog.pg_replication_origin_advance(%s, %s::pg_catalog.pg_lsn)",
        (origin, str(committed)),
    )
    conn.execute("SELECT pg_catalog.pg_replication_origin_session_setup(%s)", (origin,))


def ensure_origin(conn: psycopg.Connection[Any], name: str) -> bool:
    """Create the replication origin if absent; True when it was created."""
    row = conn.execute(
        "SELECT pg_catalog.pg_replication_origin_create(%s) "
        "WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_origin WHERE roname = %s)",
        (name, name),
    ).fetchone()
    return row is not None


def origin_progress(conn: psycopg.Connection[Any], name: str) -> Lsn:
    """The origin's durable progress (``Lsn(0)`` when it has none)."""
    row = conn.execute(
        "SELECT pg_catalog.pg_replication_origin_progress(%s, true)::text", (name,)
    ).fetchone()
    if row is None or row[0] is None:
        return Lsn(0)
    return Lsn.parse(str(row[0]))


def local_flush_lsn(conn: psycopg.Connection[Any]) -> Lsn:
    row = conn.execute("SELECT pg_catalog.pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(str(row[0]))


def prepared_gids(conn: psycopg.Connection[Any], prefix: str) -> set[str]:
    """GIDs of this worker's prepared transactions in the current database."""
    rows = conn.execute(
        "SELECT gid FROM pg_catalog.pg_prepared_xacts "
        "WHERE database = pg_catalog.current_database() AND gid LIKE %s",
        (prefix.replace("_", r"\_") + "%",),
    ).fetchall()
    return {str(r[0]) for r in rows}
