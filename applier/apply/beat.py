"""What the worker says about itself: status row, progress log, systemd.

Two parts, because one of them must go on when the other cannot:

* :class:`Beat`, called by :meth:`applier.apply.worker.Worker._loop_body`
  once per iteration (at least every 0.5 s when the source is idle, after
  every batch otherwise): the heartbeat of ``applier.worker_status`` every
  ``status_interval`` and ``WATCHDOG=1`` (rate-limited by
  :class:`~applier.service.Notifier`). They say the apply loop comes round.
* :class:`Reporter`, a thread of the worker for its whole run: every
  ``status_interval`` the lag (:mod:`applier.lag`) into the status row
  (``lag_at``, ``pending_since``, read by ``applier status``) and a
  ``STATUS=`` line for systemd (what the worker does, lag, last applied
  commit); every ``max(progress_interval, status_interval)`` s the "progress"
  log line. It only reads plain attributes of the worker (as the metrics'
  scrape does), so it never waits for the apply loop: while the loop is
  blocked (a lock on the target) the lag it tells keeps growing, which is when
  it matters most, and ``STATUS=`` says since when the loop has not come round.

Why the watchdog is fed from the loop and nowhere else while streaming: the
loop only comes back there when a batch was applied or the stream was idle and
the target answered (``settle``/``poll``, the flush check, the slot
confirmation). A loop stuck in a blocking call -- a target lock, a connection
that hangs without an error -- never gets there, the keepalives stop, and
systemd's ``WatchdogSec=`` restarts the worker, which resumes from the origin.
The heartbeat stops with them, so ``applier status`` calls the worker stale.

Between sessions (a transient fault, backoff before reconnecting) the worker
feeds the watchdog from its backoff sleep too, and says "reconnecting" in
``STATUS=``: the process is alive and doing what a restart would do (retry),
with a growing backoff a restart would reset. A connection attempt that hangs
has its own timeouts (``connect_timeout``, keepalives), well inside the
watchdog interval.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from applier.apply.handlers.dispatch import Applier
from applier.apply.parallel import PoolStats
from applier.lag import Lag
from applier.lsn import pg_timestamp
from applier.service import Notifier
from applier.status.row import WorkerState

if TYPE_CHECKING:
    from applier.apply.worker import Worker

log = logging.getLogger("applier.apply")


class Beat:
    """The apply loop's liveness: the heartbeat row and the watchdog."""

    def __init__(
        self,
        notifier: Notifier,
        status: WorkerState,
        applier: Applier,
        interval: float,
        parallel: Callable[[], PoolStats | None] = lambda: None,
    ) -> None:
        #: The pool's figures (parallel apply), written with the heartbeat.
        self.parallel = parallel
        self.notifier = notifier
        self.status = status
        self.applier = applier
        self.interval = interval
        self.last_beat = time.monotonic()

    def tick(self, now: float) -> None:
        self.notifier.watchdog(now)
        if now - self.last_beat >= self.interval:
            self.last_beat = now
            a = self.applier
            stats = self.parallel()
            self.status.heartbeat(
                a.applied_txns,
                a.skipped_changes,
                a.last_commit_lsn,
                a.last_commit_ts,
                None if stats is None else dataclasses.asdict(stats),
            )


class Reporter:
    """The thread that tells the lag: status row, ``STATUS=``, the progress log."""

    def __init__(self, worker: Worker, status: WorkerState) -> None:
        self.worker = worker
        self.status = status
        self.interval = worker.cfg.apply.status_interval
        self.log_every = max(worker.cfg.apply.progress_interval, self.interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="applier reporter", daemon=True)
        self.last_log = time.monotonic()
        self.txns_at_log = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)  # a status write is bounded by the target's timeouts

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.report(time.monotonic())

    def report(self, now: float) -> None:
        w = self.worker
        lag = w.lag()
        self.status.lag(w.pending_since())
        w.notify.status(self.status_line(lag, now))
        if now - self.last_log >= self.log_every:
            self._progress(lag, now)

    def status_line(self, lag: Lag, now: float) -> str:
        w, a = self.worker, self.worker.applier
        parts = [w.phase]
        if w.stream is None or a is None:
            return parts[0]
        busy = now - w.loop_at
        if w.phase == "streaming" and busy >= 2 * self.interval:
            parts.append(f"the apply loop has not come round for {busy:.0f}s")
        parts += [f"lag {lag.describe()}", f"applied {a.applied_txns} txns"]
        if a.last_commit_ts:
            when = pg_timestamp(a.last_commit_ts).isoformat(timespec="seconds")
            parts.append(f"last commit {a.last_commit_lsn} at {when}")
        parts.append(f"confirmed {w.stream.confirmed}")
        return ", ".join(parts)

    def _progress(self, lag: Lag, now: float) -> None:
        w, a = self.worker, self.worker.applier
        applied = a.applied_txns if a is not None else 0
        ctx: dict[str, Any] = {
            "txns_per_s": round((applied - self.txns_at_log) / (now - self.last_log), 1),
            "applied_txns": applied,
        }
        # Only numbers: a lag not known is left out, never printed as "None".
        if lag.seconds is not None:
            ctx["lag_s"] = round(lag.seconds, 1)
        if lag.bytes is not None:
            ctx["lag_bytes"] = lag.bytes
        if w.stream is not None:
            ctx["confirmed"] = w.stream.confirmed
        if a is not None:
            ctx["skipped_changes"] = a.skipped_changes
            ctx["missing_rows"] = a.resolver.missing_rows
        log.info("progress", extra={"ctx": ctx})
        self.last_log, self.txns_at_log = now, applied
