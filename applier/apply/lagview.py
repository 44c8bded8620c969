"""The worker's lag, as every place that shows it reads it (:mod:`applier.lag` defines it).

Read from the reporter and metrics threads: only attributes the apply loop
replaces whole (positions, the flush tracker's released position) are read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from applier.lag import Lag, PendingCommits, measure
from applier.lsn import Lsn, now_pg_timestamp, pg_timestamp

if TYPE_CHECKING:
    from applier.apply.handlers.dispatch import Applier
    from applier.stream.client import LogicalStream


def done_lsn(stream: LogicalStream | None, applier: Applier | None) -> Lsn | None:
    """The source position up to which everything is applied or had nothing for us:
    the session's start (the origin), the last commit whose result came, what the
    flush tracker released, what was confirmed (received, once nothing is in hand)."""
    if stream is None:
        return None
    done: int = max(stream.options.start_lsn, stream.confirmed)
    if applier is not None:
        done = max(done, applier.last_commit_lsn or 0, applier.flush.flushed_remote)
    return Lsn(done)


def lag_now(
    stream: LogicalStream | None, done: Lsn | None, pending: PendingCommits, source: Lsn | None
) -> Lag:
    """The lag now: ``source`` the source's WAL position if known better than by the
    walsender's last message (the metrics' probe)."""
    if stream is None or done is None:
        return Lag(None, 0.0 if not pending else None)
    at = Lsn(max(stream.last_received, source or 0))
    return measure(at, done, pending.oldest(done), pg_timestamp(now_pg_timestamp()))
