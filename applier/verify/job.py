"""The verify job: round 1 over every range, then the rounds that absorb writes.

Planning
--------
Every table is cut into key ranges (:mod:`.ranges`), each with the sampled
keys inside it as cuts. A task (:mod:`.task`) hashes a range per piece on
both sides at once and narrows its differing pieces down to rows.

Who runs the tasks: the driver while Spark starts, then Spark
-------------------------------------------------------------
Spark is started at once, in a thread, and takes a few seconds (JVM,
Python workers). Meanwhile the driver runs the ranges itself, one at a
time in each of ``slots`` threads (each with one session per server), from
a queue ordered largest first. Once Spark is up, the ranges not yet started
are dealt to at most ``slots`` Spark tasks (after the driver's threads end
the range each is on, so no more than ``slots`` ranges are hashed at once);
the results are the same wherever a range ran. A verify whose ranges all
ran before Spark came up does not wait for it: the start-up is paid once,
overlapped with the first queries, as the bootstrap does. ``slots`` is
``[verify] parallelism``, else Spark's task slots (``local[N]``: N; before
Spark is up, for another master: the driver's cores).

On a cluster this puts the first seconds of hashing on the driver, which
must reach both databases anyway (it plans and rechecks); the bulk of a big
verify still runs on the executors.

A local master (``local[N]``) does not start Spark at all: its tasks would
run on the driver's own cores and do what the driver's threads do (send
queries; the hashing is in the servers), after a JVM and Python workers
took CPU from the servers on the same machine (bench/README-verify.md).

Rounds
------
Rounds 2..N (``--rounds``, default 3) run in the driver: only the rows found
differing are read again by key, under a new snapshot and after a new
catch-up wait. A row is reported only when it differed in every round; a
row that was merely in flight (changed on the source, not yet applied on
the target, or applied past the snapshot) agrees in a later round.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import defaultdict, deque
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from . import largeobjects as large_objects
from .hashing import Catchup, Sides
from .ranges import KeyRange, VTable
from .report import Report, SchemaDiff, TableReport
from .schema import SEQUENCE_BEHIND
from .task import MAX_DIFFS, RangeResult, Work, recheck, run_range, run_work

if TYPE_CHECKING:  # a task imports this module on an executor: no config library there
    from ..config import Config

log = logging.getLogger(__name__)

Item = tuple[VTable, KeyRange]


class SparkStarter(Protocol):
    """A SparkContext being started in the background (``applier.bootstrap.spark.SparkStarter``)."""

    def start(self) -> Any: ...
    def ready(self) -> bool: ...
    def context(self) -> Any: ...


def deal(items: list[Item], parts: int) -> list[list[Item]]:
    """Round-robin: each partition gets ranges of every table (no partition with one big table)."""
    out: list[list[Item]] = [[] for _ in range(max(1, min(parts, len(items))))]
    for i, item in enumerate(items):
        out[i % len(out)].append(item)
    return out


def task_slots(cfg: Config, sc: Any) -> int:
    try:
        slots = max(1, int(sc.defaultParallelism))
    except Exception:  # a context without the usual attributes
        slots = 1
    return min(slots, cfg.verify.parallelism or slots)


def local_master(cfg: Config) -> bool:
    """Spark would run the tasks on this machine: the driver's threads do it alone."""
    return cfg.bootstrap.spark_master.startswith("local")


def driver_slots(cfg: Config) -> int:
    """Ranges the driver hashes at once before Spark is up: what Spark would run at once."""
    if cfg.verify.parallelism:
        return cfg.verify.parallelism
    m = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", cfg.bootstrap.spark_master)
    if m:
        return max(1, int(m.group(1)))
    return max(1, os.cpu_count() or 1)


class RangeQueue:
    """The ranges not started yet: the driver's threads take one at a time, Spark the rest."""

    def __init__(self, items: list[Item]) -> None:
        self._items = deque(items)
        self._lock = threading.Lock()

    def take(self) -> Item | None:
        with self._lock:
            return self._items.popleft() if self._items else None

    def rest(self) -> list[Item]:
        with self._lock:
            out = list(self._items)
            self._items.clear()
            return out

    def __len__(self) -> int:
        return len(self._items)


class DriverThread(threading.Thread):
    """Hashes ranges from the queue on its own two sessions until it is empty."""

    def __init__(self, cfg: Config, queue: RangeQueue, catchup: Catchup) -> None:
        super().__init__(name="verify-driver", daemon=True)
        self.cfg, self.queue, self.catchup = cfg, queue, catchup
        self.results: list[RangeResult] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        sides: Sides | None = None
        named: dict[str, int] = defaultdict(int)
        try:
            while (item := self.queue.take()) is not None:
                if sides is None:
                    c = self.cfg
                    sides = Sides(
                        c.source.conninfo(), c.target.conninfo(), self.catchup,
                        c.verify.statement_timeout,
                    )  # fmt: skip
                t, rng = item
                self.results.append(run_range(sides, t, rng, self.cfg.verify.fetch_rows, named))
        except BaseException as e:  # re-raised by the main thread
            self.error = e
            self.queue.rest()  # the others stop after their range
        finally:
            if sides is not None:
                sides.close()


def largest_first(items: list[Item], ranges_of: dict[str, int]) -> list[Item]:
    """A table without a key is one range of the whole table: start those first."""
    return sorted(items, key=lambda it: -(it[0].est_rows // max(1, ranges_of[it[0].name])))


def hash_ranges(
    cfg: Config, spark: SparkStarter, items: list[Item], catchup: Catchup
) -> list[RangeResult]:
    """Round 1: the driver's threads while Spark starts, then Spark takes what is left."""
    ranges_of: dict[str, int] = defaultdict(int)
    for t, _ in items:
        ranges_of[t.name] += 1
    queue = RangeQueue(largest_first(items, ranges_of))
    threads = [DriverThread(cfg, queue, catchup) for _ in range(driver_slots(cfg))]
    for th in threads:
        th.start()
    rest: list[Item] = []
    spark_takes_over = not local_master(cfg)
    while any(th.is_alive() for th in threads):
        if spark_takes_over and spark.ready() and len(queue):
            rest = queue.rest()
            break
        time.sleep(0.02)
    for th in threads:
        th.join()
    for th in threads:
        if th.error is not None:
            raise th.error
    results = [r for th in threads for r in th.results]
    log.info(
        "verify: ranges hashed by the driver",
        extra={"ctx": {"ranges": len(results), "left_to_spark": len(rest)}},
    )
    if rest:
        results += hash_on_spark(cfg, spark.context(), rest, catchup, cfg.verify.fetch_rows)
    return results


def hash_on_spark(
    cfg: Config, sc: Any, items: list[Item], catchup: Catchup, fetch_rows: int
) -> list[RangeResult]:
    """Ranges as a Spark job; at most ``task_slots`` tasks at once."""
    from ..bootstrap.executors import task_dsns
    from ..bootstrap.spark import spark_failure

    parts = deal(items, task_slots(cfg, sc))
    src_dsn, tgt_dsn = task_dsns(cfg, sc)
    works = [
        Work(
            src_dsn,
            tgt_dsn,
            catchup,
            cfg.verify.statement_timeout,
            fetch_rows,
            tuple(p),
        )
        for p in parts
    ]
    outcome: dict[str, Any] = {}
    group = f"applier-verify-{id(works)}"

    def job() -> None:
        try:
            sc.setJobGroup(group, "applier verify")
            rdd = sc.parallelize(works, numSlices=len(works))
            outcome["results"] = rdd.flatMap(run_work).collect()
        except BaseException as e:  # reported to the driver thread below
            outcome["error"] = e

    worker = threading.Thread(target=job, name="spark-verify", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.5)
    except KeyboardInterrupt:
        sc.cancelJobGroup(group)
        raise
    if "error" in outcome:
        raise spark_failure(outcome["error"], "verify")
    results: list[RangeResult] = outcome["results"]
    return results


def catchup_of(cfg: Config, src: Any, tgt: Any) -> Catchup:
    """Wait for the target only when a worker streams into it (else nothing would move)."""
    has_origin = tgt.execute(
        "SELECT 1 FROM pg_replication_origin WHERE roname = %s", (cfg.origin,)
    ).fetchone()
    active = src.execute(
        "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (cfg.source.slot,)
    ).fetchone()
    wait = has_origin is not None and active is not None and bool(active[0])
    return Catchup(cfg.origin, cfg.source.slot, wait, cfg.verify.catchup_timeout)


def verify(
    cfg: Config,
    spark: SparkStarter,
    *,
    patterns: list[str] | None,
    chunk_rows: int,
    rounds: int,
    strict_sequences: bool = False,
) -> Report:
    """Schema, then round 1 (the driver while ``spark`` starts, then Spark), then the
    rechecks; the whole report.

    Sequences behind the source are differences only with ``strict_sequences``
    or when no worker streams: during live replication they are behind until
    ``sync-sequences`` runs at cutover, so they go to ``Report.unsynced``.
    """
    from ..bootstrap.plan import discover, published_tables
    from ..config import table_matches
    from ..privileges import check as check_privileges
    from ..privileges import scope_of
    from .hashing import connect, same_fast_hash, same_record_hash, value_hashed
    from .ranges import first_ranges, tables_to_verify
    from .schema import compare_schema

    started = time.monotonic()
    if not local_master(cfg):
        spark.start()  # the JVM boots while the driver plans and hashes the first ranges
    timeout = cfg.verify.statement_timeout
    src = connect(cfg.source.conninfo(), "source", timeout)
    tgt = connect(cfg.target.conninfo(), "target", timeout)
    try:
        # Before discovery, which needs USAGE on the schemas: one refusal for all.
        published = [
            (s, n)
            for s, n in published_tables(src, cfg)
            if not patterns or any(table_matches(p, s, n) for p in patterns)
        ]
        check_privileges("verify", scope_of(src, published), source=src, target=tgt)
        ddl_tables = [
            (s, n)
            for s, n in discover(src, cfg).ddl_tables
            if not patterns or any(table_matches(p, s, n) for p in patterns)
        ]
        schema = compare_schema(src, tgt, ddl_tables)
        fast = same_fast_hash(src, tgt)
        by_value = fast and same_record_hash(src, tgt)
        tables = [
            replace(t, fast_hash=fast, record_hash=by_value and value_hashed(src, tgt, t))
            for t in tables_to_verify(src, tgt, cfg, patterns)
        ]
        items = [(t, r) for t in tables for r in first_ranges(src, t, chunk_rows)]
        catchup = catchup_of(cfg, src, tgt)
        schema, unsynced = split_unsynced(schema, strict_sequences or not catchup.wait)
    finally:
        src.close()
        tgt.close()
    reports = {t.name: TableReport(t.name, bool(t.key)) for t in tables}
    for t, _ in items:
        reports[t.name].ranges += 1
    log.info(
        "verify: planned",
        extra={"ctx": {"tables": len(tables), "ranges": len(items), "fast_hash": fast,
                       "by_value": sum(t.record_hash for t in tables),
                       "seconds": round(time.monotonic() - started, 2)}},
    )  # fmt: skip
    hashed = time.monotonic()
    results = hash_ranges(cfg, spark, items, catchup) if items else []
    log.info(
        "verify: ranges hashed",
        extra={"ctx": {"seconds": round(time.monotonic() - hashed, 2),
                       "differing_rows": sum(len(r.diffs) for r in results)}},
    )  # fmt: skip
    for r in results:
        rep = reports[r.table]
        rep.rows += r.rows
        rep.seconds += r.seconds
        rep.differences += r.diffs
        rep.truncated = rep.truncated or r.truncated
    lagging = recheck_rounds(cfg, tables, reports, catchup, rounds)
    reports.update(large_objects.compare(cfg, patterns, MAX_DIFFS))  # not in the rounds
    report = Report(list(reports.values()), schema, rounds, time.monotonic() - started, lagging)
    report.unsynced = unsynced
    return report


def split_unsynced(
    schema: list[SchemaDiff], strict: bool
) -> tuple[list[SchemaDiff], list[SchemaDiff]]:
    """(differences, sequences not yet synced): behind-the-source sequences move to the
    second list unless ``strict``; a sequence missing on the target stays a difference."""
    if strict:
        return schema, []
    behind = [s for s in schema if s.kind == "sequence" and s.problem == SEQUENCE_BEHIND]
    return [s for s in schema if s not in behind], behind


def recheck_rounds(
    cfg: Config,
    tables: list[VTable],
    reports: dict[str, TableReport],
    catchup: Catchup,
    rounds: int,
) -> int:
    """Rounds 2..N in the driver: keep the rows that differ every time."""
    if rounds <= 1 or not any(r.differences for r in reports.values()):
        return 0
    sides = Sides(
        cfg.source.conninfo(), cfg.target.conninfo(), catchup, cfg.verify.statement_timeout
    )
    try:
        for n in range(2, rounds + 1):
            for t in tables:
                rep = reports[t.name]
                if rep.differences:
                    started = time.monotonic()
                    before = len(rep.differences)
                    rep.differences = recheck(sides, t, rep.differences)
                    rep.seconds += time.monotonic() - started
                    log.info(
                        "verify: recheck",
                        extra={"ctx": {"round": n, "table": t.name, "before": before,
                                       "after": len(rep.differences)}},
                    )  # fmt: skip
        return sides.lagging
    finally:
        sides.close()
