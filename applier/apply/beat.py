"""What the apply loop says about itself: status row, progress log, systemd.

Called by :meth:`applier.apply.worker.Worker._loop_body` once per iteration
(at least every 0.5 s when the source is idle, after every batch otherwise):

* every ``status_interval``: the heartbeat of ``applier.worker_status`` and a
  ``STATUS=`` line for systemd (lag, last applied commit);
* every ``max(10, status_interval)`` s: the "progress" log line;
* ``WATCHDOG=1`` (rate-limited by :class:`~applier.service.Notifier`).

Why the watchdog is fed from here and nowhere else while streaming: the loop
only comes back here when a batch was applied or the stream was idle and the
target answered (``settle``/``poll``, the flush check, the slot
confirmation). A loop stuck in a blocking call -- a target lock, a connection
that hangs without an error -- never gets here, the keepalives stop, and
systemd's ``WatchdogSec=`` restarts the worker, which resumes from the origin.

Between sessions (a transient fault, backoff before reconnecting) the worker
feeds the watchdog from its backoff sleep too, and says "reconnecting" in
``STATUS=``: the process is alive and doing what a restart would do (retry),
with a growing backoff a restart would reset. A connection attempt that hangs
has its own timeouts (``connect_timeout``, keepalives), well inside the
watchdog interval.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from applier.lsn import now_pg_timestamp, pg_timestamp
from applier.service import Notifier

from .handlers import Applier
from .state import WorkerState

log = logging.getLogger("applier.apply")


class Beat:
    """The per-loop bookkeeping of one session's apply loop."""

    def __init__(
        self,
        notifier: Notifier,
        status: WorkerState,
        applier: Applier,
        stream: Any,
        interval: float,
    ) -> None:
        self.notifier = notifier
        self.status = status
        self.applier = applier
        self.stream = stream
        self.interval = interval
        self.last_beat = self.last_log = time.monotonic()
        self.txns_at_log = applier.applied_txns

    def lag_s(self) -> float | None:
        ts = self.applier.last_commit_ts
        return (now_pg_timestamp() - ts) / 1e6 if ts else None

    def tick(self, now: float) -> None:
        self.notifier.watchdog(now)
        if now - self.last_beat >= self.interval:
            self.last_beat = now
            a = self.applier
            self.status.heartbeat(
                a.applied_txns, a.skipped_changes, a.last_commit_lsn, a.last_commit_ts
            )
            self.notifier.status(self.status_line())
        if now - self.last_log >= max(10.0, self.interval):
            self._progress(now)

    def status_line(self) -> str:
        a = self.applier
        lag = self.lag_s()
        parts = [
            "streaming",
            f"lag {lag:.1f}s" if lag is not None else "lag unknown (nothing applied yet)",
            f"applied {a.applied_txns} txns",
        ]
        if a.last_commit_ts:
            when = pg_timestamp(a.last_commit_ts).isoformat(timespec="seconds")
            parts.append(f"last commit {a.last_commit_lsn} at {when}")
        parts.append(f"confirmed {self.stream.confirmed}")
        return ", ".join(parts)

    def _progress(self, now: float) -> None:
        a = self.applier
        rate = (a.applied_txns - self.txns_at_log) / (now - self.last_log)
        lag = self.lag_s()
        log.info(
            "progress",
            extra={
                "ctx": {
                    "txns_per_s": round(rate, 1),
                    "applied_txns": a.applied_txns,
                    "lag_s": None if lag is None else round(lag, 1),
                    "confirmed": self.stream.confirmed,
                    "skipped_changes": a.skipped_changes,
                    "missing_rows": a.missing_rows,
                }
            },
        )
        self.last_log, self.txns_at_log = now, a.applied_txns
