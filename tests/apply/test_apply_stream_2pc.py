"""Streamed large transactions (with subtransaction aborts) and two-phase commit."""

from __future__ import annotations

import time

import pytest
from applykit import Runner, wait_equal, wait_for
from conftest import ONE_PAIR, SMOKE_PAIRS, Pair


def _small_decoding_memory(pair: Pair) -> None:
    # The walsender reads it at start; the database-level setting reaches it.
    pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")


@pytest.mark.parametrize("pair", SMOKE_PAIRS, indirect=True)
def test_streamed_transaction_with_subxact_abort(pair: Pair) -> None:
    _small_decoding_memory(pair)
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE u (id int, w text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(
        apply={"memory_limit": "64kB", "spool_dir": str(pair.workdir / "spool")}
    )
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec(
        """
        BEGIN;
        INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 3000) g;
        SAVEPOINT a;
        INSERT INTO t SELECT g, 'aborted' FROM generate_series(3001, 6000) g;
        SAVEPOINT b;
        INSERT INTO u SELECT g, 'aborted too' FROM generate_series(1, 2000) g;
        ROLLBACK TO SAVEPOINT a;
        SAVEPOINT c;
        INSERT INTO u SELECT g, 'kept' FROM generate_series(1, 2000) g;
        RELEASE SAVEPOINT c;
        UPDATE t SET v = 'updated' WHERE id % 10 = 0;
        DELETE FROM t WHERE id % 7 = 0;
        COMMIT;
        """
    )
    # A streamed transaction that aborts entirely.
    pair.pub_exec(
        "BEGIN; INSERT INTO t SELECT g, 'gone' FROM generate_series(10001, 14000) g; ROLLBACK"
    )
    pair.pub_exec("INSERT INTO t VALUES (-1, 'after')")
    wait_equal(pair, ["t"], runner=runner, timeout=90)
    wait_equal(pair, ["u"], runner=runner, order="t.id, t.w")
    assert runner.stop() == 0
    assert not list((pair.workdir / "spool").glob("*.spool"))
    assert "streamed transaction commits" in runner.log()
    assert "on_disk=True" in runner.log()


def _rollback_prepared_on_failure(pair: Pair, *gids: str) -> None:
    """Source prepared transactions outlive a failed test and block the shared cluster
    (slot creation waits for them, DROP DATABASE refuses): roll back what is left."""

    def cleanup() -> None:
        for gid in gids:
            if pair.pub_exec(f"SELECT 1 FROM pg_prepared_xacts WHERE gid = '{gid}'"):
                pair.pub.execute(f"ROLLBACK PREPARED '{gid}'", pair.pub_db)

    pair.cleanup.append(cleanup)


@pytest.mark.parametrize("pair", SMOKE_PAIRS, indirect=True)
def test_two_phase_commit_and_rollback(pair: Pair) -> None:
    """15+ sources: prepared on the target at PREPARE. A 14 source (protocol 2) cannot
    decode PREPARE: a warning, and each arrives at COMMIT PREPARED as an ordinary one."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    _rollback_prepared_on_failure(pair, "g1", "g2")
    cfg = pair.write_config(apply={"two_phase": True})
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("BEGIN; INSERT INTO t VALUES (1, 'p1'); PREPARE TRANSACTION 'g1'")
    pair.pub_exec("BEGIN; INSERT INTO t VALUES (2, 'p2'); PREPARE TRANSACTION 'g2'")
    prepared = "SELECT gid FROM pg_prepared_xacts ORDER BY gid"
    if pair.pub.version >= 15:
        wait_for(lambda: len(pair.sub_exec(prepared)) == 2, what="two prepared transactions")
        assert all(g.startswith(f"applier_{pair.slot}_") for (g,) in pair.sub_exec(prepared))
    else:
        assert "two_phase needs proto_version 3 (PostgreSQL 15+)" in runner.log()
    assert pair.sub_exec("SELECT count(*) FROM t") == [(0,)]
    pair.pub_exec("COMMIT PREPARED 'g1'")
    pair.pub_exec("ROLLBACK PREPARED 'g2'")
    wait_equal(pair, ["t"], runner=runner)
    assert pair.sub_exec("SELECT id FROM t") == [(1,)]
    wait_for(lambda: pair.sub_exec(prepared) == [], what="no prepared transactions left")
    assert runner.stop() == 0


# Not 14-18: a 14 source has no two-phase decoding (the test above shows what it does).
@pytest.mark.parametrize("pair", ["15-15", "15-18", "17-18"], indirect=True)
def test_two_phase_restart_between_prepare_and_commit(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    _rollback_prepared_on_failure(pair, "g1", "g2")
    cfg = pair.write_config(apply={"two_phase": True})
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("BEGIN; INSERT INTO t VALUES (1, 'p1'); PREPARE TRANSACTION 'g1'")
    prepared = "SELECT count(*) FROM pg_prepared_xacts"
    wait_for(lambda: pair.sub_exec(prepared) == [(1,)], what="prepared on the target")
    runner.kill()  # SIGKILL between prepare and commit
    pair.pub_exec("COMMIT PREPARED 'g1'")
    pair.pub_exec("BEGIN; INSERT INTO t VALUES (2, 'p2'); PREPARE TRANSACTION 'g2'")
    runner = Runner(pair, cfg, "applier2.log").start().ready()
    wait_for(lambda: pair.sub_exec("SELECT count(*) FROM t") == [(1,)], what="g1 committed")
    wait_for(lambda: pair.sub_exec(prepared) == [(1,)], what="g2 prepared")
    runner.kill()
    time.sleep(0.5)
    runner = Runner(pair, cfg, "applier3.log").start().ready()  # g2 re-sent: skipped
    pair.pub_exec("COMMIT PREPARED 'g2'")
    wait_equal(pair, ["t"], runner=runner)
    wait_for(lambda: pair.sub_exec(prepared) == [(0,)], what="nothing left prepared")
    assert runner.stop() == 0


@pytest.mark.parametrize("any_pair", ["18-18", "16-18"], indirect=True)
def test_streaming_parallel_interleaved_transactions(any_pair: Pair) -> None:
    """streaming = "parallel" (protocol 4): two streamed transactions interleave, one
    with a subtransaction abort (whose Stream Abort carries its LSN), one aborting."""
    pair = any_pair
    _small_decoding_memory(pair)
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"streaming": "parallel", "memory_limit": "64kB"})
    runner = Runner(pair, cfg).start().ready()
    with pair.pub_conn() as a, pair.pub_conn() as b, pair.pub_conn() as c:
        for conn in (a, b, c):
            conn.autocommit = True
            conn.execute("BEGIN")
        for step in range(4):
            lo = step * 1000
            a.execute(f"INSERT INTO t SELECT g, 'a' FROM generate_series({lo + 1}, {lo + 1000}) g")
            b.execute("SAVEPOINT s")
            b.execute(
                f"INSERT INTO t SELECT g, 'b' FROM generate_series({lo + 10001}, {lo + 11000}) g"
            )
            if step % 2:
                b.execute("ROLLBACK TO SAVEPOINT s")
            else:
                b.execute("RELEASE SAVEPOINT s")
            c.execute(
                f"INSERT INTO t SELECT g, 'c' FROM generate_series({lo + 20001}, {lo + 21000}) g"
            )
        c.execute("ROLLBACK")
        b.execute("COMMIT")
        a.execute("UPDATE t SET v = 'a2' WHERE id % 3 = 0 AND id <= 4000")
        a.execute("COMMIT")
    wait_equal(pair, ["t"], runner=runner, timeout=90)
    assert pair.sub_exec("SELECT v, count(*) FROM t GROUP BY v ORDER BY v") == [
        ("a", 2667), ("a2", 1333), ("b", 2000)
    ]  # fmt: skip
    assert runner.stop() == 0
    assert "streamed transaction commits" in runner.log()


@ONE_PAIR
def test_logical_messages_among_rows_plain_and_streamed(pair: Pair) -> None:
    """Logical decoding messages (transactional or not) inside a plain transaction,
    inside a streamed one and alone: applied past, every row around them applied."""
    _small_decoding_memory(pair)
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec(
        """
        BEGIN;
        INSERT INTO t VALUES (1, 'a');
        SELECT pg_catalog.pg_logical_emit_message(true, 'app', 'in a transaction');
        SELECT pg_catalog.pg_logical_emit_message(false, 'app', 'not transactional');
        INSERT INTO t VALUES (2, 'b');
        COMMIT;
        """
    )
    pair.pub_exec("SELECT pg_catalog.pg_logical_emit_message(false, 'app', 'alone')")
    pair.pub_exec(
        """
        BEGIN;
        INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(3, 3000) g;
        SELECT pg_catalog.pg_logical_emit_message(true, 'app', repeat('m', 1000));
        UPDATE t SET v = 'after the message' WHERE id % 10 = 0;
        COMMIT;
        """
    )
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
