"""What a reader costs the walsender: its send syscalls for one backlog, per reader.

    .venv/bin/python bench/walsender_sends.py [--version 18] [--workload pgbench]

One throwaway pair (as bench/apply_bench.py starts it), one backlog, two slots
made before it: pg_recvlogical drains one to /dev/null, ``applier run`` the
other. ``strace -c`` is attached to each walsender as soon as the slot shows
its pid (a few ms in for pg_recvlogical; after applier's start-up for
applier, before its START_REPLICATION is served), and its summary of the send
and receive calls is printed when the walsender exits. Needs strace. The
counts matter, not the times: strace slows every call it sees.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply_bench import server_pair
from applybench.common import DB, Ctx, one, sh, slot_pid, wait_marker
from applybench.consumers import Applier
from applybench.workloads import WORKLOADS, Workload, prepare, reset_target


def traced(pub: object, slot: str) -> subprocess.Popen[str]:
    """strace -c on the slot's walsender, once it exists."""
    deadline = time.monotonic() + 60
    while (pid := slot_pid(pub, slot)) is None:  # type: ignore[arg-type]
        if time.monotonic() > deadline:
            raise SystemExit(f"no walsender for {slot} in 60 s")
        time.sleep(0.002)
    return subprocess.Popen(
        ["strace", "-c", "-f", "-p", str(pid)], stderr=subprocess.PIPE, text=True
    )


def summary(label: str, strace: subprocess.Popen[str]) -> None:
    out = strace.communicate()[1]
    keep = ("calls", "sendto", "recvfrom", "epoll_wait", "total")
    print(f"== {label}")
    print("\n".join(line for line in out.splitlines() if any(k in line for k in keep)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", type=int, default=18)
    ap.add_argument("--workload", default="pgbench", choices=sorted(WORKLOADS))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="walsender-sends-") as tmp:
        Path(tmp).chmod(0o755)  # the clusters run as the postgres user when we are root
        run(args.version, WORKLOADS[args.workload], Path(tmp))


def run(version: int, w: Workload, tmp: Path) -> None:
    with server_pair(version, tmp) as (pub, sub):
        ctx = Ctx(pub, sub, version, tmp, 1.0, 600, 600, 1500, 60, 1024)
        prepare(ctx, w)
        applier = Applier()
        applier.prepare(ctx, w, 1)
        rslot = "walsender_sends_r"
        sh(pub, f"SELECT pg_create_logical_replication_slot('{rslot}', 'pgoutput')")
        w.run(ctx)
        sh(pub, "INSERT INTO marker VALUES (1)")
        end = one(pub, "SELECT pg_current_wal_lsn()::text")
        reset_target(ctx, w)
        proto = "4" if version >= 16 else "3"
        reader = subprocess.Popen(
            [pub.bin("pg_recvlogical"), "-h", "127.0.0.1", "-p", str(pub.port), "-U", "postgres",
             "-d", DB, "-S", rslot, "--start", "-E", end, "-f", "/dev/null",
             "-o", f"proto_version={proto}", "-o", "publication_names=pub", "--no-loop"],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        strace = traced(pub, rslot)
        reader.wait()
        summary("pg_recvlogical", strace)
        applier.start(ctx)
        strace = traced(pub, applier.slot)
        wait_marker(sub, 1, 600)
        applier.stop(0)
        summary("applier", strace)


if __name__ == "__main__":
    main()
