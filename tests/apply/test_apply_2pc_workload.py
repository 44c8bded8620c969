"""Two-phase commit under a long mixed workload, with no fault at all: zero exits.

Prepared transactions (committed and rolled back) interleave with ordinary ones.
The apply session's own prepared statements must survive every PREPARE
TRANSACTION, COMMIT PREPARED and ROLLBACK PREPARED (issue 12, item 19: psycopg's
automatic statement preparation answered a ``ROLLBACK PREPARED`` with
``DEALLOCATE ALL``, and the next change found its statement gone).
"""

from __future__ import annotations

import re
import subprocess

import pytest
from applykit import Runner, wait_equal
from conftest import ONE_PAIR, Pair
from test_apply_faults import TABLES, _pgbench_setup

SCRIPT = """
\\set aid random(1, 100000 * :scale)
\\set tid random(1, 10 * :scale)
\\set delta random(-5000, 5000)
\\set kind random(0, 3)
\\set g random(1, 2000000000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime)
  VALUES (:tid, 1, :aid, :delta, CURRENT_TIMESTAMP);
INSERT INTO txlog VALUES (txid_current(), :client_id);
\\if :kind = 0
PREPARE TRANSACTION 'g:client_id-:g';
COMMIT PREPARED 'g:client_id-:g';
\\elif :kind = 1
PREPARE TRANSACTION 'g:client_id-:g';
ROLLBACK PREPARED 'g:client_id-:g';
\\else
END;
\\endif
"""


@pytest.mark.slow
@ONE_PAIR
def test_two_phase_mixed_workload_never_exits(pair: Pair) -> None:
    _pgbench_setup(pair)
    cfg = pair.write_config(apply={"two_phase": True, "status_interval": 1})
    runner = Runner(pair, cfg).start().ready()
    # Rate-limited to about what the worker applies with two-phase on (each prepared
    # transaction is its own target transaction): ~3200 transactions, half of them
    # prepared, interleave as before, without a half-minute backlog to wait out.
    script = pair.workdir / "tx2pc.sql"
    script.write_text(SCRIPT)
    bench = subprocess.run(
        [pair.pub.bin("pgbench"), "-n", "-c", "3", "-T", "8", "-R", "400", "-f", str(script),
         "-h", "127.0.0.1", "-p", str(pair.pub.port), "-U", "postgres", pair.pub_db],
        capture_output=True, timeout=90,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr.decode()
    assert runner.alive(), f"applier exited {runner.proc and runner.proc.poll()}:\n{runner.log()}"
    wait_equal(pair, TABLES, runner=runner, timeout=90)
    q = "SELECT tid, bid, aid, delta, mtime FROM pgbench_history ORDER BY 1, 2, 3, 4, 5"
    assert pair.pub_exec(q) == pair.sub_exec(q)
    assert pair.sub_exec("SELECT count(*) FROM pg_prepared_xacts") == [(0,)]
    bad = re.findall(r"^\S+ (?:ERROR|WARNING) .*$", runner.log(), re.M)
    assert not bad, "\n".join(bad[:20])
    assert runner.stop() == 0
    assert pair.pub_exec("SELECT count(*) FROM txlog")[0][0] > 100
