"""Prometheus metrics of ``applier run``: ``[metrics] listen = "HOST:PORT"`` serves ``/metrics``.

The endpoint is the official ``prometheus_client``'s HTTP server, in daemon
threads of the worker process, with its own registry: the standard
``process_*``, ``python_*`` (and ``python_gc_*``) collectors, and
:class:`WorkerCollector`, which builds every ``applier_*`` metric at scrape
time from plain attributes the worker keeps anyway (positions, counters,
:class:`~applier.apply.core.tally.Tally`). Nothing on the apply path calls the
metrics library or takes a lock for it: the apply thread only bumps ints and
dict entries, and a scrape reads them (copies, see :mod:`applier.apply.core.tally`).

What the numbers mean
=====================

* Changes and conflicts count at the *commit* of the target transaction they
  went into (the ``done`` callback of a pipelined commit), so a group rolled
  back and replayed one by one is counted once, when it commits. A change a
  conflict policy resolved (skip, keep_local, ...) is also an applied change.
  Changes of a two-phase transaction count at its PREPARE.
* Skipped changes: ``reason`` is ``excluded`` (``[tables]``), ``table_rule``,
  ``transaction_rule`` or ``error_rule`` (``applier skip``), ``table_sync``
  (a table not copied yet: :mod:`applier.apply.rules.tablesync`).
* Positions: *received* is the highest WAL position the walsender told us of
  (XLogData and keepalives: its ``wal_end``); *applied* the end of the last
  source transaction committed on the target (the origin's progress);
  *confirmed* what the slot was told is durably applied (it also moves over
  transactions with nothing for us and idle WAL).
* ``applier_lag_bytes`` and ``applier_lag_seconds``: the lag as
  :mod:`applier.lag` defines it for every place that shows it
  (:meth:`~applier.apply.worker.Worker.lag`): bytes from the source's position
  (the higher of *received* and the source's current WAL position read with
  the slot query below) to the position the worker is done up to; seconds since
  the commit of the oldest source transaction received and not applied, 0 when
  none is pending. Clock skew between the source and this host adds to the
  seconds.
* ``applier_slot_retained_wal_bytes``: ``pg_wal_lsn_diff(current, restart_lsn)``
  of our slot. It needs a query on the source, done *at scrape time* on a
  separate ordinary connection (kept open, reopened after a failure) with a
  5 s connect and statement timeout, at most once per ``[apply]
  status_interval`` (a cached value in between, whoever scrapes). So the apply
  loop never waits for it and never runs it when nobody scrapes; a slow or
  unreachable source only makes the scrape slower (bounded) and the metric
  absent. (From the worker loop it would cost the loop a round trip to the
  source, or a thread anyway.)
* ``applier_reconnects_total{side}``: reconnection attempts after a fault (a
  fault retried every second for a minute counts each attempt), by the server
  whose connection failed, told by where the error was raised: the replication
  stream's code (``applier.stream``) is ``source``, a spool file ``local``,
  anything else (apply session, catalog and status connections) ``target``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import psycopg
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from psycopg import sql

from applier import pgconn
from applier.apply.core.tally import count_fault, fault_side
from applier.config import Config
from applier.errors import ConfigError
from applier.lag import SOURCE_WAL_LSN
from applier.lsn import Lsn

__all__ = ["WorkerCollector", "count_fault", "fault_side", "serve"]

if TYPE_CHECKING:
    from applier.apply.parallel.pool import PoolStats
    from applier.apply.worker import Worker

log = logging.getLogger("applier.metrics")

#: Seconds the slot query may take to connect, and to run.
PROBE_TIMEOUT = 5

#: Upper bounds of the group size histogram (source transactions per target commit).
GROUP_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)

SLOT_SQL = sql.SQL("""
SELECT pg_catalog.pg_wal_lsn_diff(w.lsn, s.restart_lsn)::bigint,
       pg_catalog.pg_wal_lsn_diff(w.lsn, '0/0')::bigint
FROM (SELECT {source_wal} AS lsn) w
LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = %s
""").format(source_wal=SOURCE_WAL_LSN)


def serve(cfg: Config, worker: Worker) -> Any:
    """Start the endpoint if ``[metrics] listen`` is set; the server, or None.

    A port in use or an address this host does not have is a :class:`ConfigError`
    (exit 2): a restart would meet it again.
    """
    address = cfg.metrics.address
    if address is None:
        return None
    host, port = address
    registry = _registry(WorkerCollector(worker, SlotProbe(cfg)))
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise ConfigError(
            f"[metrics] listen = {cfg.metrics.listen!r}: cannot listen there: {e.strerror or e}",
            hint="another process holds the port (another applier run?) or the host is not "
            "an address of this machine; pick another [metrics] listen, or stop the other "
            "process",
        ) from None
    log.info("metrics endpoint listening", extra={"ctx": {"url": f"http://{host}:{port}/metrics"}})
    return server


def _registry(collector: Collector) -> CollectorRegistry:
    """A registry of our own (no global state): the standard collectors and ours."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(collector)
    return registry


class SlotProbe:
    """The slot's retained WAL and the source's WAL position, read at most every
    ``status_interval`` s on an ordinary connection of its own (see the module doc)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.interval = cfg.apply.status_interval
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._read_at = -math.inf
        #: (retained bytes or None when the slot is missing, source WAL position).
        self.value: tuple[int | None, int] | None = None

    def read(self) -> tuple[int | None, int] | None:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= self.interval:
                self._read_at = now
                self.value = self._query()
            return self.value

    def _query(self) -> tuple[int | None, int] | None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = pgconn.connect(
                    self.cfg.source.conninfo(), side="source", purpose="applier metrics",
                    connect_timeout=PROBE_TIMEOUT,
                    extra={"statement_timeout": str(PROBE_TIMEOUT * 1000)},
                )  # fmt: skip
            row = self._conn.execute(SLOT_SQL, (self.cfg.source.slot,)).fetchone()
        except (psycopg.Error, ConfigError) as e:
            log.debug("metrics: reading the slot's retained WAL failed: %s", e)
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            return None
        if row is None or row[1] is None:
            return None
        return (None if row[0] is None else int(row[0])), int(row[1])


def _parallel(stats: PoolStats | None) -> Iterator[Metric]:
    """Parallel apply (``[apply] workers`` > 1): the sessions and what serialised them."""
    if stats is None:
        return
    yield _gauge("applier_apply_sessions", "Target sessions applying at once", stats.sessions)
    yield _gauge(
        "applier_apply_in_flight_transactions",
        "Transactions handed to the sessions and not committed yet",
        stats.in_flight,
    )
    yield _gauge(
        "applier_apply_waiting_transactions",
        "Transactions in flight waiting (for an earlier one sharing a key, a session, "
        "or their commit turn)",
        stats.waiting,
    )
    yield _counter(
        "applier_apply_serialised",
        "Transactions that waited for all or some earlier ones to commit before starting, "
        "by reason (key: a row or key an earlier one writes; barrier: one that cannot "
        "run beside others, or came after one)",
        ["reason"],
        {("key",): stats.serialised_by_key, ("barrier",): stats.serialised_by_barrier},
    )
    yield CounterMetricFamily(
        "applier_apply_deadlocks",
        "Later transactions rolled back because an earlier one waited for their locks",
        value=stats.deadlocks,
    )
    yield CounterMetricFamily(
        "applier_apply_retried",
        "Transactions rolled back and applied again after their predecessor committed",
        value=stats.retried,
    )
    yield _gauge(
        "applier_apply_inline",
        "1 while the leader's own session applies ordinary transactions (applier's CPU "
        "is the limit), 0 while the pool does",
        stats.inline,
    )
    yield CounterMetricFamily(
        "applier_apply_lane_switches",
        "Moves of ordinary transactions between the pool and the leader's own session",
        value=stats.lane_switches,
    )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, labels: list[str], counts: dict[Any, int]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, n in sorted(counts.items()):
        family.add_metric(list(key), n)
    return family


class WorkerCollector(Collector):
    """Every ``applier_*`` metric, read from the worker at scrape time."""

    def __init__(self, worker: Worker, probe: SlotProbe) -> None:
        self.worker = worker
        self.probe = probe

    def describe(self) -> Iterable[Metric]:
        return []  # registered without a trial collect (that would query the source)

    def collect(self) -> Iterator[Metric]:
        w = self.worker
        stream, applier = w.stream, w.applier
        up = stream is not None and stream.is_streaming
        yield _gauge("applier_up", "1 while the worker streams from the slot, else 0", int(up))
        yield from self._positions(stream, applier)
        tally = w.tally
        yield CounterMetricFamily(
            "applier_applied_transactions",
            "Source transactions committed on the target",
            value=applier.applied_txns if applier is not None else w.applied_txns,
        )
        yield _counter(
            "applier_applied_changes",
            "Changes of committed transactions sent to the target, by table and operation",
            ["table", "operation"],
            tally.applied.copy(),
        )
        yield _counter(
            "applier_skipped_changes",
            "Changes not applied, by table and reason (excluded, table_rule, "
            "transaction_rule, error_rule, table_sync)",
            ["table", "reason"],
            tally.skipped_total.copy(),
        )
        yield _counter(
            "applier_conflicts",
            "Conflicts met in committed transactions, by table, type and resolution",
            ["table", "type", "resolution"],
            tally.conflicts_total.copy(),
        )
        yield CounterMetricFamily(
            "applier_apply_errors",
            "Failures of a target transaction other than a lost connection (replayed "
            "one by one or carefully, or the one that stopped the worker)",
            value=w.apply_errors,
        )
        yield _counter(
            "applier_reconnects",
            "Reconnection attempts after faults, by the side that failed (source, target, local)",
            ["side"],
            {(side,): n for side, n in {"source": 0, "target": 0, **w.reconnects}.items()},
        )
        yield self._groups(tally.group_sizes.copy())
        yield from _parallel(w.parallel_stats())
        spools = applier.spools if applier is not None else None
        memory = spools.mem_bytes if spools is not None else 0
        disk = sum(s.disk_bytes for s in list(spools.spools.values())) if spools else 0
        family = GaugeMetricFamily(
            "applier_spool_bytes",
            "Bytes of streamed transactions held until their commit, in memory and on disk",
            labels=["where"],
        )
        family.add_metric(["memory"], memory)
        family.add_metric(["disk"], disk)
        yield family

    def _positions(self, stream: Any, applier: Any) -> Iterator[Metric]:
        probe = self.probe.read()
        received = int(stream.last_received) if stream is not None else 0
        confirmed = int(stream.confirmed) if stream is not None else 0
        applied = 0
        if applier is not None and applier.last_commit_lsn is not None:
            applied = int(applier.last_commit_lsn)
        elif stream is not None:
            applied = int(stream.options.start_lsn)
        yield _gauge("applier_received_lsn", "Highest source WAL position received", received)
        yield _gauge(
            "applier_applied_lsn",
            "End of the last source transaction committed on the target (the origin)",
            applied,
        )
        yield _gauge(
            "applier_confirmed_lsn", "Source position confirmed to the slot (flushed)", confirmed
        )
        if stream is None:
            return
        lag = self.worker.lag(Lsn(probe[1]) if probe is not None else None)
        if lag.bytes is not None:
            yield _gauge(
                "applier_lag_bytes",
                "Source WAL not done yet: the source's position minus what is applied "
                "(or had nothing to apply)",
                lag.bytes,
            )
        if lag.seconds is not None:
            yield _gauge(
                "applier_lag_seconds",
                "Age of the oldest source commit received and not applied (0 when none)",
                lag.seconds,
            )
        if probe is not None and probe[0] is not None:
            yield _gauge(
                "applier_slot_retained_wal_bytes",
                "WAL the source keeps for the slot (current position minus restart_lsn)",
                probe[0],
            )

    def _groups(self, sizes: dict[int, int]) -> Metric:
        buckets: list[tuple[str, float]] = []
        for bound in GROUP_BUCKETS:
            buckets.append((str(bound), sum(n for s, n in sizes.items() if s <= bound)))
        buckets.append(("+Inf", sum(sizes.values())))
        return HistogramMetricFamily(
            "applier_group_size",
            "Source transactions per target commit (group commit)",
            buckets=buckets,
            sum_value=sum(s * n for s, n in sizes.items()),
        )
