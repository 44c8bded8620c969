"""Telling the slot what is durably applied on the target (after every batch).

The slot's confirmed position may only move to a source position whose
transactions are committed *and flushed* on the target: the flush tracker
(:class:`~applier.apply.target.origin.FlushTracker`) pairs each commit's end LSN
with its target WAL position, and releases it once the target's flush
position passed it. Between fully processed batches, with nothing pending,
everything received is applied, so the received position (keepalives' ends
included) may be confirmed too: an idle source's slot moves on. On the way
out (stop, error) the last received position may lie inside a transaction we
did not apply, so only what the tracker released is confirmed.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import psycopg

from applier.apply.handlers.dispatch import IDLE, Applier
from applier.apply.handlers.until import Until
from applier.apply.target.origin import local_flush_lsn
from applier.errors import ApplierError
from applier.lsn import Lsn

log = logging.getLogger("applier.apply")

#: Seconds between two reads of the target's WAL flush position while idle ...
FLUSH_CHECK_INTERVAL = 0.1
#: ... and while batches keep coming: each commit's result carries the flush position
#: (TargetSession.flushed_seen), so asking is needed only while a long transaction in
#: hand makes no commits. A round trip per 0.1 s held the loop ~10 ms each on a busy
#: 2-core machine, where the catalog backend waits for a CPU.
FLUSH_CHECK_BUSY = 1.0


class ConfirmStream(Protocol):
    """What confirming reads and sends on the stream."""

    @property
    def last_received(self) -> Lsn: ...

    def confirm(self, flush_lsn: Lsn) -> None: ...
    def send_status(self, reply_requested: bool = False) -> None: ...


class Confirmer:
    """Confirms positions on the stream; releases commits with the flush position the
    commits' own results carry, and reads it from the target at most every
    :data:`FLUSH_CHECK_INTERVAL` s (:data:`FLUSH_CHECK_BUSY` s while batches come: a
    round trip; commits are pipelined, so some are nearly always pending)."""

    def __init__(self) -> None:
        self.until: Until | None = None
        self._checked = 0.0

    def confirm(
        self,
        stream: ConfirmStream,
        applier: Applier,
        catalog_conn: psycopg.Connection[Any],
        final: bool = False,
        busy: bool = False,
        quiet: bool = True,
    ) -> None:
        """Tell the slot the source position durably applied on the target (``busy``:
        the batch just applied was not empty; ``quiet``: nothing received is held or
        in flight elsewhere, as with parallel apply's leader)."""
        flush = applier.flush
        try:
            if flush.pending:
                flush.release(applier.session.flushed_seen)
            now = time.monotonic()
            every = FLUSH_CHECK_BUSY if busy else FLUSH_CHECK_INTERVAL
            if flush.pending and (final or now - self._checked >= every):
                self._checked = now
                flush.release(local_flush_lsn(catalog_conn))
            position = flush.flushed_remote
            idle = quiet and not final and applier.state is IDLE and not applier.session.in_txn
            received = stream.last_received
            if self.until is not None:
                received = self.until.confirmable(received)  # never past the position
            if idle and not flush.pending and received > position:
                position = received
            stream.confirm(position)
            if final:
                stream.send_status()
        except (ApplierError, psycopg.Error) as e:
            if not final:
                raise
            log.debug("last status update failed: %s", e)
