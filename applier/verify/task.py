"""One verify task: hash ranges on both sides at once, narrow the differing ones to rows.

A task runs in a Spark executor or in one of the driver's threads (see
:mod:`.job`), so it imports the standard library and psycopg only (through
:mod:`.hashing`, :mod:`.ranges` and :mod:`.report`): an executor needs
nothing else.

First pass
----------
A range is hashed per piece, between the sampled keys inside it (its
``cuts``), in one scan of the range on each side, the two sides at once
(:meth:`.hashing.Sides.piece_hashes`). Equal ranges move a few numbers per
piece and side, no row.

Narrowing: one round trip per level
-----------------------------------
The differing pieces of a range are narrowed together. Each level is one
query per side (the two at once) over the rows of those pieces, grouped by a
*bucket*: a 64-bit hash of the row's key modulo ``m`` (:func:`.hashing.bucket`;
a table without a key buckets by the row hash). Because the key decides the
bucket, a row falls into the same bucket on both sides whatever else either
side holds, so no cut has to be found first (the previous version walked a
piece's keys for cuts with a query of its own, then hashed the pieces: two
round trips a level, one piece at a time). ``m`` is chosen for about
``BUCKET_ROWS`` rows a bucket, so one level usually suffices: a 1000- or
5000-row piece with one difference becomes one bucket of ~8 rows. A next level, if
the differing buckets still hold more than ``fetch_rows`` rows, multiplies
``m`` and keeps to the differing buckets (``h % m_prev`` in the list), so the
levels nest.

Once the differing buckets hold at most ``fetch_rows`` rows (or cutting no
longer helps: most rows differ), their (key, row hash) pairs are read from
both sides, and the rows of the keys whose hash differs are read in full,
by key, under a new snapshot: a row that was in flight often agrees by then
and drops out at once. Reading pairs costs ~20 us a row in Python, hashing
again in the server far less, hence buckets down to a few rows first.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from .hashing import Catchup, RangeHash, Sides, in_buckets, keys_where
from .ranges import Bound, KeyRange, VTable, ranges_where
from .report import Diff

#: Rows a bucket holds on average at the level that cuts a differing set. Small
#: buckets make the (key, row hash) pairs read after it small: one difference
#: costs the pairs of ~8 rows. The query returns ``rows / BUCKET_ROWS`` groups.
BUCKET_ROWS = 8
#: Buckets one level returns at most per side (a query result of ~100 kB).
MAX_BUCKETS = 8192
#: Differing rows named per table at most; past it the table is only said to differ.
MAX_DIFFS = 10_000
#: Keys read back per query in the rechecks.
RECHECK_BATCH = 1000


@dataclass(frozen=True)
class Work:
    """What one task does: its ranges, on its own two sessions."""

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
    """A Spark task: hash and narrow its ranges on two sessions of its own."""
    sides = Sides(work.src_dsn, work.tgt_dsn, work.catchup, work.statement_timeout)
    try:
        named: dict[str, int] = defaultdict(int)
        return [run_range(sides, t, rng, work.fetch_rows, named) for t, rng in work.items]
    finally:
        sides.close()


def run_range(
    sides: Sides, t: VTable, rng: KeyRange, fetch_rows: int, named: dict[str, int]
) -> RangeResult:
    """Hash one range on both sides; name its differing rows (``named``: per table so far)."""
    started = time.monotonic()
    if rng.cuts:  # hashed piece by piece in one scan
        pairs = sides.piece_hashes(t, rng, list(rng.cuts))
        pieces = rng.pieces()
    else:
        pairs, pieces = [sides.hashes(t, rng)], [rng]
    res = RangeResult(t.name, sum(s.rows for s, _ in pairs), sum(d.rows for _, d in pairs), 0.0)
    differing = [(p, s, d) for p, (s, d) in zip(pieces, pairs, strict=True) if s != d]
    if differing:
        rows = sum(max(s.rows, d.rows) for _, s, d in differing)
        budget = MAX_DIFFS - named.get(t.name, 0)
        res.diffs, res.truncated = narrow(
            sides, t, [p for p, _, _ in differing], rows, fetch_rows, budget
        )
        named[t.name] = named.get(t.name, 0) + len(res.diffs)
    res.seconds = time.monotonic() - started
    return res


def narrow(
    sides: Sides, t: VTable, pieces: list[KeyRange], rows: int, fetch_rows: int, budget: int
) -> tuple[list[Diff], bool]:
    """The rows that differ in ``pieces`` (about ``rows`` rows; at most ``budget`` of them
    named; True when more were left)."""
    if budget <= 0:
        return [], True
    where, params = ranges_where(t, pieces)
    modulus, buckets = 1, [(0, rows)]
    while rows > fetch_rows:
        per = max(2, math.ceil(rows / (len(buckets) * BUCKET_ROWS)))
        per = min(per, MAX_BUCKETS // len(buckets))
        if per < 2 or modulus * per >= 2**62:
            break  # as fine as one query can tell: read what is left
        sub = modulus * per
        w, p = in_buckets(t, where, params, modulus, [b for b, _ in buckets])
        hashes = sides.bucket_hashes(t, w, p, sub)
        found = sorted((b, max(s.rows, d.rows)) for b, (s, d) in hashes.items() if s != d)
        if not found:
            return [], False  # equal under this snapshot: rows that were in flight
        left = sum(n for _, n in found)
        modulus, buckets = sub, found
        if left > rows // 2:
            rows = left
            break  # most rows differ: another level would not narrow them
        rows = left
    return read_buckets(sides, t, where, params, modulus, buckets, fetch_rows, budget)


def read_buckets(
    sides: Sides,
    t: VTable,
    where: sql.Composable,
    params: list[Any],
    modulus: int,
    buckets: list[tuple[int, int]],
    fetch_rows: int,
    budget: int,
) -> tuple[list[Diff], bool]:
    """(key, row hash) pairs of the differing buckets, about ``fetch_rows`` rows a query
    (more when most rows differ), until ``budget`` rows are named."""
    batch = max(fetch_rows, min(budget, MAX_DIFFS) * 2)
    out: list[Diff] = []
    i = 0
    while i < len(buckets):
        if len(out) >= budget:
            return out, True
        chunk: list[int] = []
        n = 0
        while i < len(buckets) and (not chunk or n + buckets[i][1] <= batch):
            chunk.append(buckets[i][0])
            n += buckets[i][1]
            i += 1
        w, p = in_buckets(t, where, params, modulus, chunk)
        found, more = compare_pairs(sides, t, w, p, budget - len(out))
        out += found
        if more:
            return out, True
    return out, False


def compare_pairs(
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


__all__ = ["RangeHash", "RangeResult", "Work", "recheck", "run_range", "run_work"]
