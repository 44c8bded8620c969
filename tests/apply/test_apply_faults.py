"""Faults: SIGKILL/restart, walsender terminated, subscriber crash; the pgbench crash test."""

from __future__ import annotations

import random
import subprocess
import threading
import time
from collections.abc import Callable

import pytest
from applykit import Runner, wait_equal
from conftest import Pair

PGBENCH_SCRIPT = """
\\set aid random(1, 100000 * :scale)
\\set bid random(1, 1 * :scale)
\\set tid random(1, 10 * :scale)
\\set delta random(-5000, 5000)
\\set bulk random(0, 9)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime)
  VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
INSERT INTO txlog VALUES (txid_current(), :client_id);
\\if :bulk = 0
INSERT INTO bulk SELECT txid_current(), g, repeat(E'a\\tb\\\\', g % 3)
  FROM generate_series(1, 80) g;
\\endif
END;
"""

# bulk: one transaction in ten also inserts 80 rows at once, which the worker
# sends as a COPY run (applier/apply/sql/copyrun.py; COPY_AT sets the threshold
# below the default so it does); its key catches duplicates.
COPY_AT = {"copy_threshold": 64}
TABLES = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "txlog", "bulk"]


def _pgbench_setup(pair: Pair) -> None:
    pgbench = pair.pub.bin("pgbench")
    for cluster, db, steps in ((pair.pub, pair.pub_db, "dtgvp"), (pair.sub, pair.sub_db, "dtp")):
        subprocess.run(
            [pgbench, "-i", "-q", "-s", "1", "-I", steps, "-h", "127.0.0.1",
             "-p", str(cluster.port), "-U", "postgres", db],
            check=True, capture_output=True,
        )  # fmt: skip
    pair.both(
        "CREATE TABLE txlog (txid bigint PRIMARY KEY, client int);"
        "CREATE TABLE bulk (txid bigint, g int, v text, PRIMARY KEY (txid, g))"
    )
    # Start the target from the same data: copy the initial rows over.
    for t in ("pgbench_accounts", "pgbench_branches", "pgbench_tellers"):
        pair.sub_exec(f"TRUNCATE {t}")
        with (
            pair.pub_conn() as src,
            pair.sub_conn() as dst,
            src.cursor().copy(f"COPY {t} TO STDOUT") as out,
            dst.cursor().copy(f"COPY {t} FROM STDIN") as into,
        ):
            for chunk in out:
                into.write(chunk)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")


def _pgbench(pair: Pair, seconds: int, clients: int = 3) -> subprocess.Popen[bytes]:
    script = pair.workdir / "tx.sql"
    script.write_text(PGBENCH_SCRIPT)
    return subprocess.Popen(
        [pair.pub.bin("pgbench"), "-n", "-c", str(clients), "-T", str(seconds), "-f", str(script),
         "-h", "127.0.0.1", "-p", str(pair.pub.port), "-U", "postgres", pair.pub_db],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def _converged(pair: Pair, runner: Runner, timeout: float = 120) -> None:
    wait_equal(pair, TABLES, runner=runner, timeout=timeout)
    q = "SELECT tid, bid, aid, delta, mtime FROM pgbench_history ORDER BY 1, 2, 3, 4, 5"
    assert pair.pub_exec(q) == pair.sub_exec(q)
    src = pair.pub_exec("SELECT count(*), count(DISTINCT txid) FROM txlog")
    assert pair.sub_exec("SELECT count(*), count(DISTINCT txid) FROM txlog") == src


# The walsender (the source, 15 on both default pairs) is what is terminated, and the
# client's reconnect is what is tested; recovery from the target's origin on 15 and 18
# is the crash test's (CRASH_PAIRS). 15->15 repeated it for ~12 s.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_walsender_terminated_mid_stream(pair: Pair) -> None:
    _pgbench_setup(pair)
    runner = Runner(pair, pair.write_config(apply=COPY_AT)).start().ready()
    bench = _pgbench(pair, 9)  # the four terminations take 8 s
    for _ in range(4):
        time.sleep(2)
        pair.pub.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            f"WHERE slot_name = '{pair.slot}' AND active_pid IS NOT NULL"
        )
    assert bench.wait(60) == 0, bench.stderr.read() if bench.stderr else ""
    _converged(pair, runner)
    assert "retrying after a transient error" in runner.log()
    assert runner.stop() == 0


#: Recovery from a kill differs by version only in what the worker starts with: the
#: slot's creation syntax and the protocol (14: protocol 2 and the pre-15 syntax) on the
#: source, the origin's functions on the target (15, 18). 15->18 and 17->18 added
#: nothing beyond (pgbench's transactions are never streamed) at 30 s each.
CRASH_PAIRS = ["15-15", "14-18"]


@pytest.mark.slow
@pytest.mark.parametrize("pair", CRASH_PAIRS, indirect=True)
def test_crash_sigkill_20_times(pair: Pair) -> None:
    """pgbench on the source while applier run is SIGKILLed >= 20 times: no loss, no duplicate."""
    _pgbench_setup(pair)
    cfg = pair.write_config(apply={"synchronous_commit": "off", "status_interval": 0.5, **COPY_AT})
    runner = Runner(pair, cfg).start().ready()
    rnd = random.Random(4)
    pauses = [rnd.uniform(0.3, 1.8) for _ in range(20)]
    # pgbench runs as long as the 20 kills take (~20 s), and the kills go on
    # until it ends: every kill lands under load, and none after it for nothing.
    bench = _pgbench(pair, round(sum(pauses)) + 2)
    kills = 0
    while kills < 20 or bench.poll() is None:
        time.sleep(pauses[kills] if kills < 20 else rnd.uniform(0.3, 1.8))
        runner.kill()
        kills += 1
        runner = Runner(pair, cfg, f"applier{kills}.log").start()
    assert bench.wait(120) == 0, bench.stderr.read() if bench.stderr else ""
    runner.ready()
    _converged(pair, runner, timeout=150)
    assert runner.stop() == 0
    assert kills >= 20
    assert pair.pub_exec("SELECT count(*) FROM txlog")[0][0] > 200


@pytest.mark.slow
def test_subscriber_immediate_stop_mid_stream(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair(15, 15)
    _pgbench_setup(pair)
    cfg = pair.write_config(apply={"synchronous_commit": "off", **COPY_AT})
    runner = Runner(pair, cfg).start().ready()
    bench = _pgbench(pair, 11)  # the two crashes and restarts take ~8-9 s
    stopper_done = threading.Event()

    def crash_target() -> None:
        for _ in range(2):
            time.sleep(3)
            pair.sub.stop("immediate")
            time.sleep(1)
            pair.sub.start()
        stopper_done.set()

    t = threading.Thread(target=crash_target)
    t.start()
    assert bench.wait(120) == 0, bench.stderr.read() if bench.stderr else ""
    t.join(60)
    assert stopper_done.is_set()
    _converged(pair, runner, timeout=150)
    assert runner.stop() == 0
