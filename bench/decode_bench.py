"""Decoding-rate benchmark for :class:`applier.protocol.PgOutputDecoder`.

Usage::

    .venv/bin/python bench/decode_bench.py                 # synthetic stream, 1M row changes
    .venv/bin/python bench/decode_bench.py --rows 2000000 --runs 7
    .venv/bin/python bench/decode_bench.py --write bench/out/synthetic.stream
    .venv/bin/python bench/decode_bench.py --from-file bench/out/recorded.stream --proto 4

Stream file format (what :func:`write_stream_file` writes and
:func:`read_stream_file` reads): a plain sequence of records, no header; each
record is a 4-byte big-endian unsigned length followed by that many bytes of
one pgoutput message (the XLogData payload, without the ``w`` header). A
recorder only has to append ``len(payload).to_bytes(4, "big") + payload``.

The synthetic stream mimics pgbench's TPC-B-like transaction, the usual
replication load: Begin, Update pgbench_accounts (4 columns), Update
pgbench_tellers (3), Update pgbench_branches (3), Insert pgbench_history
(6 columns), Commit; plus a Delete of a history row every 10 transactions.
Updates carry only the new tuple (default replica identity, key unchanged).
The figure reported is the median of ``--runs`` full passes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import struct
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from applier.lsn import Lsn
from applier.protocol import (
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    PgOutputDecoder,
    Relation,
    TupleData,
    Update,
    encode,
)

_LEN = struct.Struct(">I")


def write_stream_file(path: str | Path, messages: Iterable[bytes]) -> int:
    """Write pgoutput messages as length-prefixed records; return how many."""
    count = 0
    with open(path, "wb") as fh:
        for msg in messages:
            fh.write(_LEN.pack(len(msg)))
            fh.write(msg)
            count += 1
    return count


def iter_stream_file(path: str | Path) -> Iterator[bytes]:
    """Yield the messages of a stream file one by one (for files too big to hold)."""
    with open(path, "rb") as fh:
        while head := fh.read(4):
            if len(head) < 4:
                raise ValueError(f"{path}: truncated record length at the end")
            (size,) = _LEN.unpack(head)
            body = fh.read(size)
            if len(body) < size:
                raise ValueError(f"{path}: last record truncated ({len(body)} of {size} bytes)")
            yield body


def read_stream_file(path: str | Path) -> list[bytes]:
    """Read a whole stream file into a list of pgoutput messages."""
    return list(iter_stream_file(path))


# Relation OIDs of the pgbench tables in the synthetic stream.
ACCOUNTS, TELLERS, BRANCHES, HISTORY = 16400, 16401, 16402, 16403


def _relations() -> list[Relation]:
    def rel(oid: int, name: str, cols: list[tuple[str, int]]) -> Relation:
        columns = tuple(Column(1 if i == 0 else 0, n, t, -1) for i, (n, t) in enumerate(cols))
        return Relation(None, oid, "public", name, "d", columns)

    i4, ch, ts = 23, 1042, 1114  # int4, bpchar, timestamp
    return [
        rel(ACCOUNTS, "pgbench_accounts",
            [("aid", i4), ("bid", i4), ("abalance", i4), ("filler", ch)]),
        rel(TELLERS, "pgbench_tellers", [("tid", i4), ("bid", i4), ("tbalance", i4)]),
        rel(BRANCHES, "pgbench_branches", [("bid", i4), ("bbalance", i4), ("filler", ch)]),
        rel(HISTORY, "pgbench_history",
            [("tid", i4), ("bid", i4), ("aid", i4), ("delta", i4), ("mtime", ts), ("filler", ch)]),
    ]  # fmt: skip


def synthetic_stream(rows: int, seed: int = 1) -> list[bytes]:
    """pgbench-like pgoutput messages (protocol 1) with at least ``rows`` row changes."""
    rnd = random.Random(seed)
    out = [encode(r) for r in _relations()]
    lsn, xid, done = 0x16B3748, 1000, 0
    filler84 = b" " * 84
    while done < rows:
        xid += 1
        aid, tid, bid = rnd.randint(1, 100_000), rnd.randint(1, 10), 1
        delta = str(rnd.randint(-5000, 5000)).encode()
        bal = str(rnd.randint(-100_000, 100_000)).encode()
        mtime = b"2026-11-21 10:%02d:%02d.%06d" % (
            rnd.randint(0, 59),
            rnd.randint(0, 59),
            rnd.randint(0, 999_999),
        )
        ts = 848_000_000_000_000 + xid * 1000
        history = TupleData.text(b"%d" % tid, b"%d" % bid, b"%d" % aid, delta, mtime, None)
        changes = [
            Update(None, ACCOUNTS, None, None, TupleData.text(b"%d" % aid, b"1", bal, filler84)),
            Update(None, TELLERS, None, None, TupleData.text(b"%d" % tid, b"1", bal)),
            Update(None, BRANCHES, None, None, TupleData.text(b"1", bal, None)),
            Insert(None, HISTORY, history),
        ]
        if xid % 10 == 0:  # history has no key: REPLICA IDENTITY FULL sends the old row
            changes.append(Delete(None, HISTORY, history, "O"))
        out.append(encode(Begin(Lsn(lsn + 600), ts, xid)))
        out.extend(encode(c) for c in changes)
        out.append(encode(Commit(0, Lsn(lsn + 600), Lsn(lsn + 640), ts)))
        lsn += 700
        done += len(changes)
    return out


def time_decode(messages: list[bytes], proto: int) -> tuple[float, float]:
    """One pass; return (wall seconds, CPU seconds). CPU time is steadier on a busy box."""
    decode = PgOutputDecoder(proto).decode
    wall, cpu = time.perf_counter(), time.process_time()
    for m in messages:
        decode(m)
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--rows", type=int, default=1_000_000, help="row changes in the synthetic stream"
    )
    ap.add_argument("--runs", type=int, default=5, help="passes; the median is reported")
    ap.add_argument("--proto", type=int, default=1, help="proto_version to decode with")
    ap.add_argument("--from-file", type=Path, help="decode a recorded stream file instead")
    ap.add_argument("--write", type=Path, help="write the synthetic stream to this file and exit")
    args = ap.parse_args(argv)

    if args.from_file:
        messages = read_stream_file(args.from_file)
        source = str(args.from_file)
    else:
        messages = synthetic_stream(args.rows)
        source = f"synthetic pgbench-like, {args.rows:,} row changes"
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        print(f"wrote {write_stream_file(args.write, messages):,} messages to {args.write}")
        return 0

    nbytes = sum(map(len, messages))
    runs = [time_decode(messages, args.proto) for _ in range(args.runs)]
    avg = nbytes / len(messages)
    print(f"source:   {source}")
    print(f"messages: {len(messages):,} ({nbytes / 1e6:.1f} MB, {avg:.1f} B avg)")
    print(f"python:   {sys.version.split()[0]}, {args.runs} runs, median reported")
    for label, times in (("wall", [w for w, _ in runs]), ("cpu", [c for _, c in runs])):
        med = statistics.median(times)
        rate, mbs = len(messages) / med / 1e6, nbytes / med / 1e6
        shown = ", ".join(f"{t:.2f}" for t in times)
        print(f"{label:9} {med:.3f}s = {rate:.2f} M msg/s, {mbs:.1f} MB/s  (runs: {shown})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
