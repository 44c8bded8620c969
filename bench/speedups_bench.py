"""Per-row cost of decoding Inserts and framing them as COPY text: C speedups vs pure Python.

Usage::

    .venv/bin/python bench/speedups_bench.py                  # 1,000,000 rows, 3 runs each
    .venv/bin/python bench/speedups_bench.py --rows 200000 --runs 5

The rows have apply_bench's ``insert`` shape (``id int, md5 text, numeric,
timestamptz``, all as pgoutput text), each an Insert as a streamed
transaction carries it (``I``, xid, relation oid, ``N``, TupleData), the bytes
that :func:`~applier.protocol.decoder.decode_streamed` reads at replay. Each
run is a fresh process, with ``APPLIER_PURE_PYTHON=1`` for the pure-Python
one; C and Python runs alternate so the shared machine's noise hits both.
Reported: the median microseconds per row of decoding alone, framing alone
(:func:`~applier.apply.sql.copyrun.text_row` of the row's values, as
``Run.add`` does), and both, and the Python/C ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def messages(rows: int) -> list[bytes]:
    """``rows`` streamed Insert messages of the bench table's shape."""
    head = b"I" + struct.pack(">II", 1234, 16384) + b"N" + struct.pack(">H", 4)
    out = []
    for g in range(1, rows + 1):
        values = (
            str(g).encode(),
            hashlib.md5(str(g).encode()).hexdigest().encode(),
            f"{g / 7.0:.20f}".encode(),
            f"2026-05-09 07:35:25.{g % 1000000:06d}+00".encode(),
        )
        out.append(head + b"".join(b"t" + struct.pack(">I", len(v)) + v for v in values))
    return out


def measure(rows: int) -> dict[str, float]:
    """Time this process's implementation (the one speedups chose) over ``rows`` rows."""
    from applier.apply.sql.copyrun import text_row
    from applier.protocol.decoder import decode_streamed
    from applier.speedups import describe

    msgs = messages(rows)
    params = [list(decode_streamed(m).new.values) for m in msgs]  # type: ignore[attr-defined]
    # Decoded and dropped, as the apply loop does (keeping a million messages
    # would time the cyclic GC's passes over them instead).
    t0 = time.perf_counter()
    for m in msgs:
        decode_streamed(m)
    t1 = time.perf_counter()
    t2 = time.perf_counter()
    for p in params:
        text_row(p)
    t3 = time.perf_counter()
    buf = bytearray()
    for m in msgs:
        buf += text_row(list(decode_streamed(m).new.values))  # type: ignore[attr-defined]
    t4 = time.perf_counter()
    us = 1e6 / rows
    return {
        "impl": describe(),
        "decode": (t1 - t0) * us,
        "frame": (t3 - t2) * us,
        "both": (t4 - t3) * us,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.rows)))
        return
    results: dict[str, list[dict[str, float]]] = {"c": [], "py": []}
    for _ in range(args.runs):
        for impl in ("c", "py"):
            env = {k: v for k, v in os.environ.items() if k != "APPLIER_PURE_PYTHON"}
            if impl == "py":
                env["APPLIER_PURE_PYTHON"] = "1"
            proc = subprocess.run(
                [sys.executable, __file__, "--child", "--rows", str(args.rows)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            got = json.loads(proc.stdout)
            results[impl].append(got)
    if results["c"][0]["impl"] != "C speedups":
        sys.exit(f"the C speedups did not load: {results['c'][0]['impl']}")
    print(f"{args.rows} rows, median of {args.runs} interleaved runs, us/row")
    print(f"{'':10} {'pure Python':>12} {'C':>8} {'Python/C':>9}")
    for part in ("decode", "frame", "both"):
        py = statistics.median(r[part] for r in results["py"])
        c = statistics.median(r[part] for r in results["c"])
        print(f"{part:10} {py:12.3f} {c:8.3f} {py / c:9.2f}")


if __name__ == "__main__":
    main()
