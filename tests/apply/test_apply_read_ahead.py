"""The stream is read ahead while the worker waits on the target (applier.stream.readahead).

The target's table is locked, so the worker's statements wait; meanwhile the
source streams 100,000 rows. The worker must take them from the walsender while
it waits (the walsender goes on), and apply each row once, in order, after the
lock goes.
"""

from __future__ import annotations

import re
import time

import pytest
from applykit import Runner, wait_equal
from conftest import ONE_PAIR, Pair

from applier.apply.target.session import TargetSession
from applier.schema import upgrade_target
from applier.stream import LogicalStream, ReplicationConnection, StreamOptions


# The read-ahead is the stream's (the source is 15 on both default pairs); the target
# only waits on a lock, alike on 15 and 18. 15->15 applied the 100,000 rows again.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_stream_read_ahead_while_the_target_waits_applies_exactly_once(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    # Streamed transactions (the read-ahead runs inside their blocks): 64kB of
    # logical_decoding_work_mem for this walsender only.
    dsn = f"{pair.pub_dsn} options='-c logical_decoding_work_mem=64kB'"
    runner = Runner(pair, pair.write_config(source={"dsn": dsn}))
    runner.start().ready()
    with pair.sub_conn() as lock, lock.transaction():
        lock.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")  # held until the block ends
        for b in range(5):
            pair.pub_exec(
                f"INSERT INTO t SELECT g, md5(g::text) FROM generate_series({b * 20000 + 1}, "
                f"{(b + 1) * 20000}) g"
            )
        pair.pub_exec("UPDATE t SET v = 'changed' WHERE id % 1000 = 0")
        pair.pub_exec("DELETE FROM t WHERE id % 999 = 0")
        time.sleep(3)  # the worker waits on the lock; the walsender has sent it all
        assert lock.execute("SELECT count(*) FROM t").fetchone() == (0,)
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    taken = re.findall(r"applier run stopped.*read_ahead_bytes=(\d+)", runner.log())
    assert taken and int(taken[-1]) > 1_000_000, taken
    # Nothing was applied twice: a restart finds nothing to do and the rows stay.
    runner.start().ready()
    pair.pub_exec("INSERT INTO t VALUES (0, 'after')")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0


@ONE_PAIR
def test_a_stream_closed_under_the_read_ahead_leaves_the_target_wait_alone(pair: Pair) -> None:
    """A lost stream is found by the reader; the worker's rollback then waits on the
    target with the stream's socket closed. Found by test_connections_cut: the wait
    tried to watch the closed socket and the worker exited 1 instead of reconnecting."""
    origin = f"ra_{pair.sub_db}"  # origins are per cluster, shared by the tests
    upgrade_target(pair.sub_dsn)
    pair.sub_exec(f"SELECT pg_replication_origin_create('{origin}')")
    pair.pub_exec("CREATE TABLE t (id int); CREATE PUBLICATION pub FOR ALL TABLES")
    with ReplicationConnection.open(pair.pub_dsn) as rc:
        rc.create_slot(origin)
    stream = LogicalStream(
        ReplicationConnection.open(pair.pub_dsn), StreamOptions(slot=origin, publications=["pub"])
    )
    stream.start()
    session = TargetSession(pair.sub_dsn, origin, "on")
    try:
        session.read_ahead = (stream.ahead, stream.socket, stream.read_ahead)
        stream.conn.close()  # as a lost connection leaves it
        session.begin()
        session.execute_sql(b"SELECT pg_catalog.pg_sleep(0.3)", "a statement still running")
        session.rollback()  # waits for its result
        assert not session.in_txn
    finally:
        session.close()
        pair.sub_exec(f"SELECT pg_replication_origin_drop('{origin}')")
