"""Settings a target role or database imposes do not break the apply (issue 12, item 14).

``ALTER DATABASE ... SET`` reaches every new session, the apply session included:
a ``statement_timeout`` cancelled a long COPY run, a ``lock_timeout`` a wait on a
row a target user held, ``default_transaction_isolation = serializable`` made the
commit subject to serialization failures. Every target connection pins them.
"""

from __future__ import annotations

import threading
import time

import pytest
from applykit import Runner, wait_equal, wait_for
from conftest import Pair


# The defaults are set before applier ever connects: its migrations run under them.
@pytest.mark.bare_target
def test_database_defaults_do_not_reach_the_apply_session(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE big (id int, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    settings = {
        "statement_timeout": "20ms",
        "lock_timeout": "20ms",
        "idle_in_transaction_session_timeout": "200ms",
        "default_transaction_isolation": "serializable",
    }
    if pair.sub.version >= 17:
        settings["transaction_timeout"] = "300ms"
    for name, value in settings.items():
        pair.sub_exec(f"ALTER DATABASE \"{pair.sub_db}\" SET {name} = '{value}'")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 100) g")
    wait_equal(pair, ["t"], runner=runner)
    # A big transaction: its COPY run takes far longer than 20 ms.
    pair.pub_exec("INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(1, 300000) g")
    # A target user holds a row the next change updates, longer than lock_timeout.
    held = threading.Event()

    def hold_row() -> None:
        with pair.sub_conn() as conn:
            conn.execute("SET lock_timeout = 0; SET statement_timeout = 0")
            conn.execute("SELECT * FROM t WHERE id = 1 FOR UPDATE")
            held.set()
            time.sleep(2)
            conn.rollback()

    holder = threading.Thread(target=hold_row)
    holder.start()
    held.wait(10)
    pair.pub_exec("UPDATE t SET v = 'b' WHERE id <= 50")
    holder.join()
    wait_equal(pair, ["t"], runner=runner, timeout=60)

    def big_rows() -> int:
        with pair.sub_conn() as conn:  # the test's own query must not be cancelled
            conn.execute("SET statement_timeout = 0")
            row = conn.execute("SELECT count(*) FROM big").fetchone()
            return int(row[0]) if row else 0

    wait_for(lambda: big_rows() == 300000, 60, "the big transaction")
    assert runner.alive()
    assert "retrying" not in runner.log()
    assert runner.stop() == 0
