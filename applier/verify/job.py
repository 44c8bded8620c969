"""The verify job: range hashes on Spark, narrowing, and the rounds that absorb writes.

Round 1 is the Spark job. Every table is cut into key ranges (:mod:`.ranges`);
the ranges are dealt to at most ``[verify] parallelism`` partitions (default:
Spark's task slots), so no more than that many tasks hash at once, each with
one session per server. A task hashes a range on both sides at once
(:mod:`.hashing`). A range that differs and holds more than ``[verify]
fetch_rows`` rows is cut by its own keys into up to ``FANOUT`` pieces,
hashed again in one scan of the range (``width_bucket`` over the cuts), and
so on; a range (or piece) small enough is read as (key, row
hash) pairs from both sides, and only the rows whose hash differs are read
in full, by key: the differing keys and what each side has. Equal ranges
move two numbers per side, no row; a differing range moves its keys and
row hashes, and row data only for the rows that differ.

Rounds 2..N (``--rounds``, default 3) run in the driver: only the rows found
differing are read again by key, under a new snapshot and after a new
catch-up wait. A row is reported only when it differed in every round; a
row that was merely in flight (changed on the source, not yet applied on
the target, or applied past the snapshot) agrees in a later round.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from psycopg import sql

from . import largeobjects as large_objects
from .hashing import Catchup, Sides, keys_where
from .ranges import Bound, KeyRange, VTable, range_where, split_range
from .report import Diff, Report, SchemaDiff, TableReport
from .schema import SEQUENCE_BEHIND

if TYPE_CHECKING:  # a task imports this module on an executor: no config library there
    from ..config import Config

log = logging.getLogger(__name__)

#: Pieces a differing range is cut into at most, per level. Hashing a piece
#: again in the server costs far less than reading its (key, hash) pairs
#: into Python (measured: 100 differences in 20 ranges of 100k rows, pairs of
#: whole ranges 24 s, 16 pieces first ~2 s), so a range is cut down to
#: pieces of ``fetch_rows`` in levels of 16.
FANOUT = 16
#: Differing rows named per table at most; past it the table is only said to differ.
MAX_DIFFS = 10_000
#: Keys read back per query in the rechecks.
RECHECK_BATCH = 1000


@dataclass(frozen=True)
class Work:
    """What one Spark task does: its ranges, on its own two sessions."""

    src_dsn: str
    tgt_dsn: str
    catchup: Catchup
    statement_timeout: float
    fetch_rows: int
    items: tuple[tuple[VTable, KeyRange], ...]


@dataclass
class RangeResult:
    table: str
    rows: int  # on the source
    target_rows: int
    seconds: float
    diffs: list[Diff] = field(default_factory=list)
    truncated: bool = False


def run_work(work: Work) -> list[RangeResult]:
    """A Spark task: hash and narrow its ranges."""
    sides = Sides(work.src_dsn, work.tgt_dsn, work.catchup, work.statement_timeout)
    try:
        out = []
        named: dict[str, int] = defaultdict(int)
        for t, rng in work.items:
            started = time.monotonic()
            if rng.cuts:  # hashed piece by piece in one scan
                pairs = sides.piece_hashes(t, rng, list(rng.cuts))
            else:
                pairs = [sides.hashes(t, rng)]
            pieces = rng.pieces() if rng.cuts else [rng]
            res = RangeResult(t.name, sum(s.rows for s, _ in pairs), 0, 0.0)
            res.target_rows = sum(d.rows for _, d in pairs)
            for piece, (s, d) in zip(pieces, pairs, strict=True):
                if s != d:
                    budget = MAX_DIFFS - named[t.name]
                    found, more = narrow(sides, t, piece, s.rows, d.rows, work, budget)
                    res.diffs += found
                    res.truncated = res.truncated or more
                    named[t.name] += len(found)
            res.seconds = time.monotonic() - started
            out.append(res)
        return out
    finally:
        sides.close()


def narrow(
    sides: Sides, t: VTable, rng: KeyRange, src_rows: int, tgt_rows: int, work: Work, budget: int
) -> tuple[list[Diff], bool]:
    """The rows that differ in ``rng`` (at most ``budget``; True when more were left)."""
    if budget <= 0:
        return [], True
    n = max(src_rows, tgt_rows)
    if not t.key or n <= work.fetch_rows:
        where, params = range_where(t, rng)
        return compare_range(sides, t, where, params, budget)
    side = "source" if src_rows >= tgt_rows else "target"
    parts = min(FANOUT, math.ceil(n / work.fetch_rows))
    pieces = split_range(sides.src if side == "source" else sides.tgt, t, rng, n, parts, side)
    if len(pieces) == 1:  # cannot cut further: read it whole
        where, params = range_where(t, rng)
        return compare_range(sides, t, where, params, budget)
    out: list[Diff] = []
    truncated = False
    hashes = sides.piece_hashes(t, rng, [p.lo for p in pieces[1:] if p.lo is not None])
    for piece, (s, d) in zip(pieces, hashes, strict=True):
        if s != d:
            found, more = narrow(sides, t, piece, s.rows, d.rows, work, budget - len(out))
            out += found
            truncated = truncated or more
    return out, truncated


def compare_range(
    sides: Sides, t: VTable, where: sql.Composable, params: list[Any], budget: int
) -> tuple[list[Diff], bool]:
    """(key, row hash) pairs of both sides, then the rows of the keys that differ.

    The pairs are 16-odd bytes a row: row *data* moves only for the rows
    that differ, read again by key (under a new snapshot: a row that was in
    flight is often equal by then and drops out at once).
    """
    s_rows, t_rows = sides.pairs(t, where, params)
    src = {tuple(r[0]) if t.key else (r[0],): r[1] for r in s_rows}
    dst = {tuple(r[0]) if t.key else (r[0],): r[1] for r in t_rows}
    idents = sorted(k for k in src.keys() | dst.keys() if src.get(k) != dst.get(k))
    if not idents:
        return [], False
    return diffs_of(sides, t, idents[:budget]), len(idents) > budget


def compare_rows(sides: Sides, t: VTable, where: sql.Composable, params: list[Any]) -> list[Diff]:
    """Read the rows under ``where`` on both sides; the ones that differ."""
    s_rows, t_rows = sides.rows(t, where, params)
    if t.key:
        src = {tuple(r[0]): (r[1], r[2]) for r in s_rows}
        dst = {tuple(r[0]): (r[1], r[2]) for r in t_rows}
        out = []
        for k in sorted(src.keys() | dst.keys()):
            a, b = src.get(k), dst.get(k)
            if a is not None and b is not None and a[0] == b[0]:
                continue
            row = (a or b or (None, None))[1]
            out.append(Diff(t.name, k, _key_dict(t, k, row), a and a[1], b and b[1]))
        return out
    src_m = {r[0]: (int(r[1]), r[2]) for r in s_rows}
    dst_m = {r[0]: (int(r[1]), r[2]) for r in t_rows}
    out = []
    for h in sorted(src_m.keys() | dst_m.keys()):
        a, b = src_m.get(h, (0, None)), dst_m.get(h, (0, None))
        if a[0] != b[0]:
            out.append(Diff(t.name, (h,), None, a[1], b[1], a[0], b[0]))
    return out


def _key_dict(t: VTable, key: Bound, row: dict[str, Any] | None) -> dict[str, Any]:
    """The key as JSON values (as the row has them), else as texts."""
    if row is not None and all(k in row for k in t.key):
        return {k: row[k] for k in t.key}
    return dict(zip(t.key, key, strict=True))


def diffs_of(sides: Sides, t: VTable, idents: list[Bound]) -> list[Diff]:
    """The rows of these keys (row hashes, without a key) on both sides, where they differ."""
    out: list[Diff] = []
    for i in range(0, len(idents), RECHECK_BATCH):
        keys = idents[i : i + RECHECK_BATCH]
        where, params = keys_where(t, keys)
        wanted = set(keys)
        out += [d for d in compare_rows(sides, t, where, params) if d.ident in wanted]
    return out


def recheck(sides: Sides, t: VTable, diffs: list[Diff]) -> list[Diff]:
    """Read the differing rows again (a new snapshot, a new catch-up): those still differing."""
    return diffs_of(sides, t, [d.ident for d in diffs])


# -- the driver -----------------------------------------------------------------------------


def deal(items: list[tuple[VTable, KeyRange]], parts: int) -> list[list[tuple[VTable, KeyRange]]]:
    """Round-robin: each partition gets ranges of every table (no partition with one big table)."""
    out: list[list[tuple[VTable, KeyRange]]] = [[] for _ in range(max(1, min(parts, len(items))))]
    for i, item in enumerate(items):
        out[i % len(out)].append(item)
    return out


def task_slots(cfg: Config, sc: Any) -> int:
    try:
        slots = max(1, int(sc.defaultParallelism))
    except Exception:  # a context without the usual attributes
        slots = 1
    return min(slots, cfg.verify.parallelism or slots)


def hash_on_spark(
    cfg: Config, sc: Any, items: list[tuple[VTable, KeyRange]], catchup: Catchup, fetch_rows: int
) -> list[RangeResult]:
    """Round 1 as a Spark job; at most ``task_slots`` tasks at once."""
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
    sc_factory: Any,
    *,
    patterns: list[str] | None,
    chunk_rows: int,
    rounds: int,
    strict_sequences: bool = False,
) -> Report:
    """Schema, then round 1 on Spark, then the rechecks; the whole report.

    Sequences behind the source are differences only with ``strict_sequences``
    or when no worker streams: during live replication they are behind until
    ``sync-sequences`` runs at cutover, so they go to ``Report.unsynced``.
    """
    from ..bootstrap.plan import discover, published_tables
    from ..config import table_matches
    from ..privileges import check as check_privileges
    from ..privileges import scope_of
    from .hashing import connect, same_fast_hash
    from .ranges import first_ranges, tables_to_verify
    from .schema import compare_schema

    started = time.monotonic()
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
        tables = [replace(t, fast_hash=fast) for t in tables_to_verify(src, tgt, cfg, patterns)]
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
                       "seconds": round(time.monotonic() - started, 2)}},
    )  # fmt: skip
    sc = sc_factory() if items else None
    hashed = time.monotonic()
    results = hash_on_spark(cfg, sc, items, catchup, cfg.verify.fetch_rows) if items else []
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
