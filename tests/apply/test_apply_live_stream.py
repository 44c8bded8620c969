"""Live apply of streamed transactions (``streaming = "parallel"``, the default).

A streamed transaction is applied into an open target transaction as it
arrives; it is dropped (rolled back, then replayed from its spool or
restreamed) when anything needs the session before its commit. Each test
would fail if live apply broke: the target's heap grows before the source
commits, and the data is exactly the source's after drops, crashes and errors.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import psycopg
import pytest
from applykit import Runner, wait_equal, wait_for
from conftest import ONE_PAIR, Pair

from applier.lsn import Lsn


def _setup(pair: Pair, **apply: object) -> tuple[Runner, Path]:
    # The walsender reads it at start: big transactions are streamed in 64kB blocks.
    pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE s (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    spool = pair.workdir / "spool"
    cfg = pair.write_config(apply={"spool_dir": str(spool), **apply})
    return Runner(pair, cfg).start().ready(), spool


def _target_heap(pair: Pair) -> int:
    """Bytes of t's heap on the target: grows with rows not yet committed."""
    return int(pair.sub_exec("SELECT pg_relation_size('t')")[0][0])


def _insert(conn: psycopg.Connection, lo: int, hi: int) -> None:
    conn.execute(f"INSERT INTO t SELECT g, repeat('x', 50) FROM generate_series({lo}, {hi}) g")


def _open_txn(pair: Pair) -> psycopg.Connection:
    conn = pair.pub_conn()
    conn.autocommit = True
    conn.execute("BEGIN")
    return conn


@ONE_PAIR
def test_applied_before_its_commit_and_rolled_back_on_abort(pair: Pair) -> None:
    runner, spool = _setup(pair, memory_limit="64kB")
    with _open_txn(pair) as x:
        _insert(x, 1, 20000)
        wait_for(lambda: _target_heap(pair) > 256 * 1024, 60, "rows applied before the commit")
        # Its in-memory insurance was forgotten past memory_limit; no spool file either.
        assert not list(spool.glob("*.spool"))
        assert pair.sub_exec("SELECT count(*) FROM t") == [(0,)]  # not committed
        x.execute("ROLLBACK")
    pair.pub_exec("INSERT INTO t VALUES (-1, 'after')")
    wait_equal(pair, ["t"], runner=runner)
    with _open_txn(pair) as x:
        _insert(x, 1, 20000)
        x.execute("UPDATE t SET v = 'y' WHERE id % 3 = 0")
        x.execute("DELETE FROM t WHERE id % 5 = 0")
        x.execute("COMMIT")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    log = runner.log()
    assert "applying a streamed transaction as it arrives" in log
    assert "stopped applying" not in log


@ONE_PAIR
@pytest.mark.parametrize("memory", ["64MB", "64kB"])
def test_dropped_when_another_transaction_commits_first(pair: Pair, memory: str) -> None:
    """64MB: replayed from its in-memory spool at its commit; 64kB: the spool was
    forgotten, so the session restarts and the transaction is streamed again."""
    runner, _ = _setup(pair, memory_limit=memory)
    with _open_txn(pair) as x:
        _insert(x, 1, 20000)
        wait_for(lambda: _target_heap(pair) > 256 * 1024, 60, "rows applied before the commit")
        pair.pub_exec("INSERT INTO s VALUES (1)")  # commits while x is live
        wait_equal(pair, ["s"], runner=runner)  # not held back by x
        _insert(x, 20001, 30000)
        x.execute("COMMIT")
    pair.pub_exec("INSERT INTO s VALUES (2)")
    wait_equal(pair, ["t", "s"], runner=runner)
    assert runner.stop() == 0
    log = runner.log()
    assert "stopped applying a streamed transaction as it arrives" in log
    assert ("restreaming a streamed transaction" in log) == (memory == "64kB")


@ONE_PAIR
def test_killed_while_live_then_committed(pair: Pair) -> None:
    runner, _ = _setup(pair, memory_limit="64kB")
    pair.pub_exec("INSERT INTO t VALUES (0, 'before')")
    wait_equal(pair, ["t"], runner=runner)
    with _open_txn(pair) as x:
        _insert(x, 1, 20000)
        wait_for(lambda: _target_heap(pair) > 256 * 1024, 60, "rows applied before the commit")
        runner.signal(signal.SIGKILL)
        runner.wait()
        _insert(x, 20001, 25000)
        x.execute("COMMIT")
    runner = Runner(pair, runner.config, log_name="again.log").start()
    wait_equal(pair, ["t"], runner=runner, timeout=90)
    assert runner.stop() == 0


@ONE_PAIR
def test_error_while_live_names_the_commit(pair: Pair) -> None:
    """A change refused while live: restreamed, spooled, and the error names the
    transaction's own commit (the LSN ``applier skip add --lsn`` takes)."""
    runner, _ = _setup(pair, memory_limit="64MB")
    pair.sub_exec("INSERT INTO t VALUES (15000, 'only on the target')")
    with _open_txn(pair) as x:
        _insert(x, 1, 20000)
        before = Lsn.parse(str(x.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]))
        x.execute("COMMIT")
        after = Lsn.parse(str(x.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]))
    assert runner.wait(90) == 3
    log = runner.log()
    assert "applying a streamed transaction as it arrives" in log
    m = re.search(r"duplicate key.*finish_lsn=([0-9A-F]+/[0-9A-F]+)", log)
    assert m, log[-3000:]
    assert before <= Lsn.parse(m.group(1)) < after
    assert pair.sub_exec("SELECT count(*) FROM t") == [(1,)]  # nothing of it committed


@ONE_PAIR
@pytest.mark.parametrize("streaming", ["parallel", "on"])
def test_copy_lane_rows_equal(pair: Pair, streaming: str) -> None:
    """Rows that skip the handlers (applier.apply.batching.copylane), live or replayed from the
    spool: values COPY must escape, NULLs, a second table between runs, a binary-free
    mix of types, and an UPDATE and a wide row that end the lane."""
    pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")
    pair.both(
        "CREATE TABLE t (id int PRIMARY KEY, v text, n numeric, a int[], j jsonb); "
        "CREATE TABLE s (id int PRIMARY KEY, w text)"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"streaming": streaming, "copy_threshold": 10})
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec(
        r"""
        BEGIN;
        INSERT INTO t SELECT g, CASE g % 5 WHEN 0 THEN NULL WHEN 1 THEN E'tab\there'
            WHEN 2 THEN E'back\\slash\nnew line\r' WHEN 3 THEN '' ELSE repeat('x', g % 300) END,
            CASE WHEN g % 7 = 0 THEN NULL ELSE g / 3.0 END, ARRAY[g, NULL, -g],
            jsonb_build_object('k', E'q"\\\t', 'g', g)
          FROM generate_series(1, 6000) g;
        INSERT INTO s SELECT g, E'\\N' FROM generate_series(1, 3000) g;
        INSERT INTO t SELECT g, 'again', 1, '{}', 'null' FROM generate_series(6001, 9000) g;
        UPDATE t SET v = 'u' WHERE id % 1000 = 0;
        INSERT INTO t SELECT g, repeat('w', 5000), NULL, NULL, NULL
          FROM generate_series(9001, 9100) g;
        COMMIT;
        """
    )
    wait_equal(pair, ["t", "s"], runner=runner, timeout=90)
    assert runner.stop() == 0
    lane_rows = [int(m) for m in re.findall(r"lane_rows=(\d+)", runner.log())]
    assert lane_rows and max(lane_rows) > 10000, runner.log()[-2000:]
