"""The leader's cost of parallel apply's write sets: µs per change, per transaction.

    .venv/bin/python bench/writeset_bench.py [--changes 200000] [--runs 5]

Each case keys the same decoded change ``--changes`` times with
:class:`applier.apply.parallel.writeset.Collector` (a fresh write set every
4 changes, as transactions end), on mappings built as the engine builds them
(:func:`applier.apply.sql.mapping.build`) with the target keys a real catalog
would give; beside it, decoding that change's bytes with the decoder the
engine uses (C speedups when built), for scale. The schedule's cost is one
transaction added, started and committed, with its write set. Medians of
``--runs`` passes, in CPU time of this process (``time.process_time``: on a
shared machine, wall time counts other processes' turns); nothing here
touches a server.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from applier.apply.parallel.schedule import Schedule
from applier.apply.parallel.tablekeys import ForeignKey, TargetKeys, UniqueIndex
from applier.apply.parallel.writeset import Collector, KeySpace, TableKeys
from applier.apply.sql.mapping import RelMap, TargetColumn, TargetTable, build
from applier.protocol import Column, Delete, Insert, Relation, TupleData, Update
from applier.protocol.decoder import PgOutputDecoder
from applier.protocol.encoder import encode
from applier.speedups import IMPLEMENTATION

INT4, TEXT, BPCHAR = 23, 25, 1042


def mapping(oid: int, name: str, cols: list[tuple[str, int, bool]], replident: str = "d") -> RelMap:
    columns = tuple(Column(1 if key else 0, c, t, -1) for c, t, key in cols)
    rel = Relation(None, oid, "public", name, replident, columns)
    target = TargetTable(
        oid, "public", name, "r",
        {c.name: TargetColumn(c.name, c.type_oid, "x", True, False) for c in columns},
    )  # fmt: skip
    return build(rel, target)


def text(*values: Any) -> TupleData:
    return TupleData.text(*(None if v is None else str(v).encode() for v in values))


def cases() -> list[tuple[str, Callable[[Collector], None], Any, Relation]]:
    space = KeySpace()
    acc = mapping(1, "pgbench_accounts", [("aid", INT4, True), ("bid", INT4, False),
                  ("abalance", INT4, False), ("filler", BPCHAR, False)])  # fmt: skip
    acc_k = TableKeys.build(acc, TargetKeys(1, (UniqueIndex(("aid",), True),)), space)
    hist = mapping(2, "pgbench_history", [("tid", INT4, False), ("bid", INT4, False),
                   ("aid", INT4, False), ("delta", INT4, False),
                   ("mtime", TEXT, False), ("filler", BPCHAR, False)])  # fmt: skip
    hist_k = TableKeys.build(hist, TargetKeys(2), space)
    orders = mapping(3, "orders", [("id", INT4, True), ("ref", TEXT, False),
                                   ("customer", INT4, False), ("note", TEXT, False)])  # fmt: skip
    orders_k = TableKeys.build(
        orders,
        TargetKeys(3, (UniqueIndex(("id",), True), UniqueIndex(("ref",), True)),
                   (ForeignKey(9, (("customer", "id"),), True),)),
        space,
    )  # fmt: skip
    filler = " " * 84
    upd = Update(None, 1, None, None, text(4711, 1, -2500, filler))
    moved = Update(None, 1, text(4711, None, None, None), "K", text(4712, 1, -2500, filler))
    ins = Insert(None, 2, text(7, 1, 4711, -2500, "2026-11-28 14:00:00.123456+00", None))
    order = Insert(None, 3, text(99, "ORD-000099", 1234, "a note"))
    dele = Delete(None, 1, text(4711, None, None, None), "K")
    return [
        ("UPDATE, key kept (pgbench_accounts)", lambda c: c.update(acc_k, upd), upd, acc.relation),
        ("UPDATE, key changed (old key sent)", lambda c: c.update(acc_k, moved), moved,
         acc.relation),
        ("DELETE by key", lambda c: c.delete(acc_k, dele), dele, acc.relation),
        ("INSERT, no key (pgbench_history)", lambda c: c.insert(hist_k, ins), ins, hist.relation),
        ("INSERT, PK + unique + foreign key", lambda c: c.insert(orders_k, order), order,
         orders.relation),
    ]  # fmt: skip


def _nothing(c: Collector) -> None:
    pass


def per_change(fn: Callable[[Collector], None], n: int) -> float:
    c = Collector()
    t0 = time.process_time()
    for i in range(n):
        fn(c)
        if i & 3 == 3:
            c.take()
    return (time.process_time() - t0) / n * 1e6


def decode_cost(msg: Any, rel: Relation, n: int) -> float:
    decoder = PgOutputDecoder()
    decoder.decode(encode(rel))
    data = encode(msg)
    decode = decoder.decode
    t0 = time.process_time()
    for _ in range(n):
        decode(data)
    return (time.process_time() - t0) / n * 1e6


def schedule_cost(n: int) -> float:
    """One transaction of 2 changes (pgbench -N) through add, start, commit."""
    space = KeySpace()
    acc = mapping(1, "a", [("aid", INT4, True), ("abalance", INT4, False)])
    tk = TableKeys.build(acc, TargetKeys(1, (UniqueIndex(("aid",), True),)), space)
    sets = []
    c = Collector()
    for i in range(n):
        c.update(tk, Update(None, 1, None, None, text(i % 100_000, 1)))
        c.update(tk, Update(None, 1, None, None, text((i * 7) % 100_000, 1)))
        sets.append(c.take())
    s = Schedule()
    t0 = time.process_time()
    for ws in sets:
        s.add(ws)
        while s.next_ready() is not None:
            pass
        while s.in_flight > 8:
            s.commit(s.committed + 1)
    while s.in_flight:
        while s.next_ready() is not None:
            pass
        s.commit(s.committed + 1)
    return (time.process_time() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"speedups: {IMPLEMENTATION}; {args.changes:,} changes a pass, median of {args.runs}\n")
    # The loop itself, with a write set taken every 4 changes and nothing keyed:
    # subtracted from each case, so a case's figure is the keying alone.
    loop = statistics.median(per_change(_nothing, args.changes) for _ in range(args.runs))
    print("| change | write set, µs/change | decode, µs/change |")
    print("|---|---|---|")
    for name, fn, msg, rel in cases():
        ws = statistics.median(per_change(fn, args.changes) for _ in range(args.runs)) - loop
        dec = statistics.median(decode_cost(msg, rel, args.changes) for _ in range(args.runs))
        print(f"| {name} | {ws:.2f} | {dec:.2f} |")
    print(f"\n(the loop and a write set taken every 4 changes: {loop:.2f} µs/change, not counted)")
    sched = statistics.median(schedule_cost(args.changes // 2) for _ in range(args.runs))
    print(f"\nschedule: {sched:.2f} µs per transaction (add, start, commit; 2 keys, 8 in flight)")


if __name__ == "__main__":
    main()
