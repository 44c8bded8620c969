"""``applier run``'s process: the worker, its signals, and the metrics endpoint.

:mod:`.worker` is what the process runs; this is where it is set up: SIGTERM
and SIGINT stop it (exit 0), SIGHUP re-reads the config, and a socket the
handlers write to wakes the stream's wait at once.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

from applier.apply.handlers.until import Until
from applier.apply.worker import Worker
from applier.config import Config
from applier.lsn import Lsn
from applier.service import signal_wakeup


def run_worker(cfg: Config, log_level: str | None = None, until: Lsn | None = None) -> int:
    """``applier run``: apply until SIGTERM/SIGINT (exit 0) or an apply error (raised);
    with ``until``, until every transaction ending at or before it is applied (exit 0)."""
    worker = Worker(cfg, log_level)
    worker.until = None if until is None else Until(until)
    if cfg.metrics.listen is not None:
        from applier.apply.metrics import serve  # prometheus_client only when asked for

        serve(cfg, worker)  # before connecting: a port in use fails first
    if threading.current_thread() is threading.main_thread():

        def handler(signum: int, frame: FrameType | None) -> None:
            worker.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGHUP, worker.service.request_reload)
        with signal_wakeup() as worker.wakeup:
            return worker.run()
    return worker.run()
