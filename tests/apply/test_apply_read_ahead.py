"""The stream is read ahead while the worker waits on the target (applier.stream.readahead).

The target's table is locked, so the worker's statements wait; meanwhile the
source sends 100,000 rows. The worker must take them from the walsender while
it waits (the walsender goes on), and apply each row once, in order, after the
lock goes.
"""

from __future__ import annotations

import re
import time

from applykit import Runner, wait_equal
from conftest import Pair


def test_stream_read_ahead_while_the_target_waits_applies_exactly_once(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config())
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
