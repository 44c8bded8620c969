"""Two-phase transactions that PostgreSQL replays at COMMIT PREPARED (issue 12, item 2).

A transaction prepared before the slot's ``two_phase_at`` is sent whole at its
COMMIT PREPARED, with its *prepare-time* LSNs, which are below the worker's
progress: Begin Prepare/Prepare must not be skipped by LSN alone.
"""

from __future__ import annotations

import threading
from typing import Any

from applykit import Runner, wait_equal, wait_for
from conftest import ONE_PAIR, TWO_SOURCES, Pair


def _slot_two_phase(pair: Pair) -> bool:
    rows = pair.pub_exec(
        f"SELECT two_phase FROM pg_replication_slots WHERE slot_name = '{pair.slot}'"
    )
    return bool(rows and rows[0][0])


@TWO_SOURCES
def test_prepared_before_two_phase_was_enabled(any_pair: Pair) -> None:
    pair = any_pair
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    # The slot is created without two-phase; the prepared transaction is not sent.
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("BEGIN; INSERT INTO t VALUES (1, 'prepared early'); PREPARE TRANSACTION 'g1'")
    pair.pub_exec("INSERT INTO t VALUES (2, 'committed after the prepare')")
    wait_for(lambda: pair.sub_exec("SELECT id FROM t") == [(2,)], what="row 2 applied")
    assert runner.stop() == 0
    assert not _slot_two_phase(pair)
    # Two-phase switched on for the existing slot: its two_phase_at is past g1's PREPARE.
    cfg = pair.write_config(apply={"two_phase": True})
    runner = Runner(pair, cfg, "applier2.log").start().ready()
    wait_for(lambda: _slot_two_phase(pair), what="two-phase enabled on the slot")
    pair.pub_exec("COMMIT PREPARED 'g1'")
    pair.pub_exec("INSERT INTO t VALUES (3, 'last')")
    wait_equal(pair, ["t"], runner=runner, timeout=20)
    assert pair.sub_exec("SELECT count(*) FROM pg_prepared_xacts") == [(0,)]
    assert runner.stop() == 0


def _waits_for(pair: Pair, xid: str) -> bool:
    rows = pair.pub_exec(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted "
        f"AND transactionid::text = '{xid}'"
    )
    return bool(rows[0][0])


@ONE_PAIR
def test_prepared_before_the_consistent_point(pair: Pair) -> None:
    """As contrib/test_decoding's twophase_snapshot: prepared after the slot's full
    snapshot, before its consistent point, committed after it."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    s2 = pair.pub_conn(autocommit=True)
    s3 = pair.pub_conn(autocommit=True)
    creator = pair.pub_conn(autocommit=True)
    for conn in (s2, s3, creator):
        pair.cleanup.append(conn.close)
    s2.execute("BEGIN")
    x2 = str(s2.execute("SELECT pg_current_xact_id()").fetchone()[0])  # type: ignore[index]
    failed: list[Any] = []

    def create() -> None:
        try:
            creator.execute(
                "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
                (pair.slot,),
            )
        except Exception as e:  # reported by the assertion below
            failed.append(e)

    thread = threading.Thread(target=create)
    thread.start()
    wait_for(lambda: _waits_for(pair, x2), what="the slot to wait for the first transaction")
    s3.execute("BEGIN")
    x3 = str(s3.execute("SELECT pg_current_xact_id()").fetchone()[0])  # type: ignore[index]
    s2.execute("COMMIT")
    wait_for(lambda: _waits_for(pair, x3), what="the slot to wait for the second transaction")
    # After the full snapshot, before the consistent point.
    s2.execute("BEGIN")
    s2.execute("INSERT INTO t VALUES (1, 'prepared in the window')")
    s2.execute("PREPARE TRANSACTION 'w1'")
    s3.execute("COMMIT")
    thread.join(30)
    assert not failed and not thread.is_alive()
    runner = Runner(pair, pair.write_config(apply={"two_phase": True})).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (2, 'after the consistent point')")
    wait_for(lambda: pair.sub_exec("SELECT id FROM t") == [(2,)], what="row 2 applied")
    pair.pub_exec("COMMIT PREPARED 'w1'")
    pair.pub_exec("INSERT INTO t VALUES (3, 'last')")
    wait_equal(pair, ["t"], runner=runner, timeout=20)
    assert pair.sub_exec("SELECT count(*) FROM pg_prepared_xacts") == [(0,)]
    assert runner.stop() == 0
