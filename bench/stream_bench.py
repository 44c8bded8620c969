"""Stream benchmark: can LogicalStream receive + decode faster than the publisher emits a backlog?

Usage::

    .venv/bin/python bench/stream_bench.py                  # PG15, 1,000,000 row changes, 3 runs
    .venv/bin/python bench/stream_bench.py --rows 2000000 --runs 5 --version 18

What it does, on a throwaway cluster (``applier.localpg.local_cluster``):

1. creates pgbench-like tables and a publication, a base slot, and one copy of
   that slot per run (``pg_copy_logical_replication_slot``), all at the same
   position, so every run reads exactly the same backlog;
2. writes a backlog of ``--rows`` row changes, an insert/update mix in
   transactions of 10,000 changes (pgbench_accounts rows of 4 columns, a
   84-char filler);
3. times (a) ``pg_recvlogical --start --no-loop -E <end> -f /dev/null`` from
   the cluster's bindir: how fast the walsender emits the backlog to a C client
   that does nothing with it; (b) :class:`LogicalStream` receive only
   (``read_raw``, no decoding); (c) :class:`LogicalStream` receive + decode
   (``read``); (d) the decoder alone on the recorded stream, in memory.

Runs (a)-(c) never advance the measured slot beyond its copy (LogicalStream uses
``report_flush=False``); each pg_recvlogical run consumes its own copy. Figures
are medians of ``--runs`` runs, wall time and CPU time (this process's user +
system time for (b)-(d), pg_recvlogical's own for (a)).

Nobody can receive faster than the walsender sends, so (c)'s wall-clock rate
is at most ~(a)'s. What says whether the client keeps up with headroom is its
*CPU capacity*: messages per second of the client's own CPU time, compared
with (a)'s wall-clock rate (goal: >= 1.5x).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from applier.localpg import LocalCluster, local_cluster
from applier.lsn import Lsn
from applier.protocol import PgOutputDecoder
from applier.stream import LogicalStream, ReplicationConnection, StreamOptions

try:  # the protocol engineer's stream file format (4-byte big-endian length + message)
    from decode_bench import read_stream_file, write_stream_file
except ImportError:  # pragma: no cover - same format, written here

    def write_stream_file(path: str | Path, messages: Iterable[bytes]) -> int:
        n = 0
        with open(path, "wb") as fh:
            for m in messages:
                fh.write(len(m).to_bytes(4, "big") + m)
                n += 1
        return n

    def read_stream_file(path: str | Path) -> list[bytes]:
        data, out, pos = Path(path).read_bytes(), [], 0
        while pos < len(data):
            size = int.from_bytes(data[pos : pos + 4], "big")
            out.append(data[pos + 4 : pos + 4 + size])
            pos += 4 + size
        return out


SCHEMA = """
CREATE TABLE pgbench_accounts (aid int PRIMARY KEY, bid int, abalance int, filler char(84));
CREATE TABLE pgbench_history (tid int, bid int, aid int, delta int, mtime timestamp);
CREATE PUBLICATION pub FOR ALL TABLES;
"""
BATCH = 10_000


def write_backlog(cluster: LocalCluster, rows: int) -> None:
    """``rows`` row changes: inserts, then updates of the same rows, 10,000 per transaction."""
    inserts = rows // 2
    with cluster.connect() as conn:
        for lo in range(1, inserts + 1, BATCH):
            hi = min(lo + BATCH - 1, inserts)
            conn.execute(
                "INSERT INTO pgbench_accounts SELECT i, 1, 0, '' "
                "FROM generate_series(%s::int, %s::int) i",
                (lo, hi),
            )
        for lo in range(1, rows - inserts + 1, BATCH):
            hi = min(lo + BATCH - 1, rows - inserts)
            conn.execute(
                "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid BETWEEN %s AND %s",
                (lo, hi),
            )


def current_lsn(cluster: LocalCluster) -> Lsn:
    return Lsn.parse(cluster.execute("SELECT pg_current_wal_lsn()::text")[0][0])


def run_recvlogical(cluster: LocalCluster, slot: str, proto: int, end: Lsn) -> tuple[float, float]:
    """Return (wall seconds, pg_recvlogical's own CPU seconds)."""
    cmd = [
        cluster.bin("pg_recvlogical"), "-d", cluster.dsn(), "--slot", slot, "--start",
        "-o", f"proto_version={proto}", "-o", "publication_names=pub",
        "--no-loop", "-E", str(end), "-f", "/dev/null",
    ]  # fmt: skip
    t0 = time.perf_counter()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    return time.perf_counter() - t0, cpu


def run_stream(
    cluster: LocalCluster, slot: str, end: Lsn, *, decode: bool, sink: list[bytes] | None = None
) -> tuple[float, float, int, int]:
    """Read the backlog with LogicalStream; return (wall s, CPU s, messages, payload bytes).

    CPU is this process's user+system time over the same span: what the client
    itself spends per message, independent of how fast the walsender emits.
    """
    conn = ReplicationConnection.open(cluster.dsn())
    stream = LogicalStream(conn, StreamOptions(slot=slot, publications=["pub"], report_flush=False))
    count = nbytes = 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    stream.start()
    try:
        while stream.last_received < end:
            if decode:
                count += len(stream.read(1.0))
            else:
                batch = stream.read_raw(1.0)
                count += len(batch)
                for _, payload in batch:
                    nbytes += len(payload)
                    if sink is not None:
                        sink.append(bytes(payload))
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
    finally:
        stream.stop()
    return elapsed, cpu, count, nbytes


def run_decoder(messages: list[bytes], proto: int) -> tuple[float, float]:
    decode = PgOutputDecoder(proto).decode
    t0, c0 = time.perf_counter(), time.process_time()
    for m in messages:
        decode(m)
    return time.perf_counter() - t0, time.process_time() - c0


def median_of(runs: int, fn: Callable[[int], tuple[float, ...]]) -> tuple[float, float]:
    """Medians of (wall, CPU) over ``runs`` runs."""
    got = [fn(i) for i in range(runs)]
    return statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="row changes in the backlog")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--version", type=int, choices=(15, 18), default=15)
    args = ap.parse_args()

    with local_cluster(args.version, name="bench") as cluster:
        cluster.execute(SCHEMA)
        with ReplicationConnection.open(cluster.dsn()) as rc:
            rc.create_slot("base")
            proto = 4 if rc.server_version >= 160000 else 3
        for i in range(args.runs):
            cluster.execute(f"SELECT pg_copy_logical_replication_slot('base', 'recv{i}')")
        t0 = time.perf_counter()
        write_backlog(cluster, args.rows)
        end = current_lsn(cluster)
        print(f"backlog: {args.rows:,} row changes written in {time.perf_counter() - t0:.1f}s, "
              f"end {end}, PostgreSQL {args.version}, proto_version {proto}")  # fmt: skip

        recorded: list[bytes] = []
        _, _, messages, nbytes = run_stream(cluster, "base", end, decode=False, sink=recorded)
        tmp = tempfile.TemporaryDirectory(prefix="applier-bench-")
        path = Path(tmp.name) / "recorded.stream"
        write_stream_file(path, recorded)
        del recorded
        mb = nbytes / 1e6
        print(f"stream: {messages:,} pgoutput messages, {mb:.1f} MB payload, recorded to {path}")

        results = {
            "(a) pg_recvlogical (publisher emit rate)": median_of(
                args.runs, lambda i: run_recvlogical(cluster, f"recv{i}", proto, end)
            ),
            "(b) LogicalStream receive only": median_of(
                args.runs, lambda i: run_stream(cluster, "base", end, decode=False)[:2]
            ),
            "(c) LogicalStream receive + decode": median_of(
                args.runs, lambda i: run_stream(cluster, "base", end, decode=True)[:2]
            ),
        }
        msgs = read_stream_file(path)
        tmp.cleanup()
        results["(d) decoder alone (recorded stream)"] = median_of(
            args.runs, lambda i: run_decoder(msgs, proto)
        )
    base = results["(a) pg_recvlogical (publisher emit rate)"][0]
    print(f"\nmedians of {args.runs} runs; wall vs (a) = (a) wall / this wall; CPU capacity =")
    print("messages / this client's own CPU seconds, vs (a) = that rate / (a)'s wall rate")
    print(f"{'':42} {'wall s':>7} {'msgs/s':>10} {'vs (a)':>7} {'CPU s':>7} "
          f"{'msgs/CPU s':>11} {'vs (a)':>7}")  # fmt: skip
    for name, (secs, cpu) in results.items():
        print(f"{name:42} {secs:7.2f} {messages / secs:10,.0f} {base / secs:6.2f}x {cpu:7.2f} "
              f"{messages / cpu:11,.0f} {base / cpu:6.2f}x")  # fmt: skip
    wall_c, cpu_c = results["(c) LogicalStream receive + decode"]
    print(f"\nreceive + decode vs publisher emit rate: wall {base / wall_c:.2f}x "
          f"(at most ~1x: nobody receives faster than the walsender sends), "
          f"CPU capacity {base / cpu_c:.2f}x (goal >= 1.5x): "
          f"{'OK' if base / cpu_c >= 1.5 else 'NOT MET'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
