"""Loop prevention (``[source] origin``): two-way replication and fan-in.

A two-way pair is two appliers, A->B and B->A, both with ``origin = "none"``:
what one applier writes on a side carries its replication origin, so the other
applier must not send it back. From a PostgreSQL 16+ source the walsender
filters (pgoutput's ``origin`` option: applier never sees those transactions);
from PostgreSQL 15 applier filters the transactions that arrive with an Origin
message. ``origin = "any"`` (the default) applies them: a transaction replicated
into the source from elsewhere reaches the target (fan-in).
"""

from __future__ import annotations

import random
import re
import threading
import time
from typing import Any

import pytest
from applykit import Runner, wait_for
from conftest import Pair

#: The writers' id ranges: A writes below B_IDS, B at and above it.
B_IDS = 1_000_000
WRITE_SECONDS = 4.0


def _slot_active(conn_fn: Any, slot: str) -> bool:
    rows = conn_fn(f"SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'")
    return bool(rows and rows[0][0])


def _rows(query: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in query("SELECT id, v FROM t ORDER BY id")]


def _drop_origin(conn_fn: Any, name: str) -> None:
    conn_fn(
        "SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin "
        f"WHERE roname = '{name}'"
    )


class Writer(threading.Thread):
    """Small transactions on one side, only on its own rows: inserts, updates, deletes."""

    def __init__(self, pair: Pair, side: str, base: int) -> None:
        super().__init__(daemon=True)
        connect = pair.pub_conn if side == "A" else pair.sub_conn
        self.conn = connect(autocommit=True)
        self.base = base
        self.rows: dict[int, str] = {}
        self.txns = 0
        self.error: BaseException | None = None
        self.rng = random.Random(base)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.conn.close()

    def _run(self) -> None:
        deadline = time.monotonic() + WRITE_SECONDS
        next_id = self.base
        while time.monotonic() < deadline:
            ops: list[tuple[str, tuple[Any, ...]]] = []
            new = dict(self.rows)
            for _ in range(self.rng.randint(1, 4)):
                kind = self.rng.random()
                if kind < 0.5 or not new:
                    next_id += 1
                    new[next_id] = f"i{next_id}"
                    ops.append(("INSERT INTO t VALUES (%s, %s)", (next_id, new[next_id])))
                elif kind < 0.85:
                    key = self.rng.choice(list(new))
                    new[key] = f"u{self.rng.randint(0, 10**6)}"
                    ops.append(("UPDATE t SET v = %s WHERE id = %s", (new[key], key)))
                else:
                    key = self.rng.choice(list(new))
                    del new[key]
                    ops.append(("DELETE FROM t WHERE id = %s", (key,)))
            with self.conn.transaction():
                for sql, params in ops:
                    self.conn.execute(sql, params)
            self.rows = new
            self.txns += 1


def _two_way_configs(pair: Pair, origin: str) -> tuple[Any, Any, str]:
    """A->B (the pair's own slot and origin) and B->A (slot and origin r_<db> on B and A)."""
    back = f"r_{pair.pub_db}"
    ab = pair.write_config(source={"origin": origin})
    ba = pair.write_config(
        source={"dsn": pair.sub_dsn, "slot": back, "origin": origin},
        target={"dsn": pair.pub_dsn},
    )
    return ab, ba, back


def _origin_lsns(pair: Pair, back: str) -> tuple[Any, Any]:
    q = "SELECT remote_lsn FROM pg_replication_origin_status WHERE external_id = '{}'"
    return pair.sub_exec(q.format(pair.slot)), pair.pub_exec(q.format(back))


def _applied(query: Any) -> int:
    return int(query("SELECT applied_txns FROM applier.worker_status")[0][0])


def test_two_way_no_row_applied_back(any_pair: Pair) -> None:
    pair = any_pair
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.both("CREATE PUBLICATION pub FOR TABLE t")
    ab, ba, back = _two_way_configs(pair, "none")
    # Cleanups run in reverse: this one after the runners are killed.
    pair.cleanup.append(lambda: _drop_origin(pair.pub_exec, back))
    r_ab = Runner(pair, ab, "ab.log").start().ready()
    r_ba = Runner(pair, ba, "ba.log").start()
    wait_for(lambda: _slot_active(pair.sub_exec, back) or not r_ba.alive(), 60, "B->A to stream")
    assert r_ba.alive(), r_ba.log()[-4000:]

    wa, wb = Writer(pair, "A", 0), Writer(pair, "B", B_IDS)
    wa.start()
    wb.start()
    wa.join()
    wb.join()
    assert wa.error is None and wb.error is None, (wa.error, wb.error)
    expected = sorted({**wa.rows, **wb.rows}.items())

    def converged() -> bool:
        for r in (r_ab, r_ba):
            assert r.alive(), f"an applier exited:\n{r.log()[-4000:]}"
        return _rows(pair.pub_exec) == expected and _rows(pair.sub_exec) == expected

    wait_for(converged, 90, "both sides to hold exactly the union of the writes")
    # Nothing comes back: the origins stop moving, and neither applier applied more
    # transactions than the other side wrote (a loop applies each one again and again).
    # (A loop moves an origin at every bounce, well under a second apart.)
    time.sleep(1)
    before = _origin_lsns(pair, back)
    time.sleep(2)
    assert _origin_lsns(pair, back) == before
    assert _rows(pair.pub_exec) == expected and _rows(pair.sub_exec) == expected
    assert r_ab.stop() == 0 and r_ba.stop() == 0
    assert 0 < _applied(pair.sub_exec) <= wa.txns
    assert 0 < _applied(pair.pub_exec) <= wb.txns
    for runner, source in ((r_ab, pair.pub), (r_ba, pair.sub)):
        log = runner.log()
        bad = re.findall(r"^\S+ (?:ERROR|WARNING) .*$", log, re.M)
        assert not bad, "\n".join(bad[:20])
        filtered = re.findall(r"transaction from another origin filtered .*origin=(\w+)", log)
        started = re.search(r"starting replication command=(.*)$", log, re.M)
        assert started is not None
        # Sent only where pgoutput knows it (16+); PostgreSQL 15 would refuse it.
        assert ("origin 'none'" in started.group(1)) == (source.version >= 16)
        if source.version >= 16:
            # The walsender filtered: not one transaction with an Origin message came.
            assert not filtered
            assert "transaction from another origin" not in log
        else:
            # PostgreSQL 15 sends them all: applier filtered the other applier's writes.
            assert filtered, log[-4000:]
            other = back if runner is r_ab else pair.slot
            assert set(filtered) == {other}


def _from_elsewhere(pair: Pair, elsewhere: str, sql: str) -> None:
    """Run ``sql`` on A as a replication would: in a session with a replication origin."""
    with pair.pub_conn(autocommit=True) as conn:
        conn.execute("SELECT pg_replication_origin_session_setup(%s)", (elsewhere,))
        for statement in sql.split(";"):
            conn.execute(statement.encode())
        # Released here, not when the backend exits: that comes after the close, and
        # the next call's setup failed now and then ("already active for PID ...").
        conn.execute("SELECT pg_replication_origin_session_reset()")


def _cleanup_elsewhere(pair: Pair, elsewhere: str) -> None:
    q = "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
    for (gid,) in pair.pub_exec(q):
        pair.pub_exec(f"ROLLBACK PREPARED '{gid}'")
    _drop_origin(pair.pub_exec, elsewhere)


@pytest.mark.parametrize("origin", ["any", "none"])
def test_fan_in_origin_any_applies_none_filters(any_pair: Pair, origin: str) -> None:
    """Transactions replicated into A (plain, streamed, prepared) reach B only with "any"."""
    pair = any_pair
    elsewhere = f"elsewhere_{pair.pub_db}"
    pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    pair.pub_exec(f"SELECT pg_replication_origin_create('{elsewhere}')")
    pair.cleanup.append(lambda: _cleanup_elsewhere(pair, elsewhere))
    cfg = pair.write_config(
        source={"origin": origin},
        apply={"two_phase": True, "streaming": "on", "spool_dir": str(pair.workdir / "spool")},
    )
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1, 'local')")
    _from_elsewhere(pair, elsewhere, "INSERT INTO t VALUES (2, 'plain')")
    # Large enough to be streamed (logical_decoding_work_mem = 64kB).
    big = "INSERT INTO t SELECT g, repeat('s', 50) FROM generate_series(1000, 4999) g"
    _from_elsewhere(pair, elsewhere, big)
    _from_elsewhere(
        pair,
        elsewhere,
        # Streamed too: Stream Prepare, then Commit Prepared.
        "BEGIN; INSERT INTO t SELECT g, 'p' FROM generate_series(10000, 13999) g;"
        "PREPARE TRANSACTION 'g3'; COMMIT PREPARED 'g3'",
    )
    _from_elsewhere(
        pair,
        elsewhere,
        "BEGIN; INSERT INTO t VALUES (4, 'rolled back'); PREPARE TRANSACTION 'g4';"
        "ROLLBACK PREPARED 'g4'",
    )
    # A restart between a (filtered) PREPARE and its COMMIT PREPARED.
    _from_elsewhere(
        pair, elsewhere, "BEGIN; INSERT INTO t VALUES (5, 'prepared'); PREPARE TRANSACTION 'g5'"
    )
    pair.pub_exec("INSERT INTO t VALUES (6, 'local')")
    local = {(1, "local"), (6, "local")}
    wait_for(lambda: local <= set(_rows(pair.sub_exec)), 60, "the local rows")
    lsn = pair.pub_exec("SELECT pg_current_wal_lsn()")[0][0]
    wait_for(
        lambda: pair.pub_exec(
            f"SELECT confirmed_flush_lsn >= '{lsn}' FROM pg_replication_slots "
            f"WHERE slot_name = '{pair.slot}'"
        )[0][0],
        60,
        "the slot to confirm the prepare",
    )
    assert runner.stop() == 0
    _from_elsewhere(pair, elsewhere, "COMMIT PREPARED 'g5'")
    pair.pub_exec("INSERT INTO t VALUES (7, 'local')")
    runner = Runner(pair, cfg).start().ready()
    wait_for(lambda: (7, "local") in _rows(pair.sub_exec) or not runner.alive(), 60, "the last row")
    assert runner.alive(), runner.log()[-4000:]
    time.sleep(1)
    got = _rows(pair.sub_exec)
    if origin == "any":
        assert got == _rows(pair.pub_exec)
        assert len(got) == 4000 + 4000 + 5
    else:
        assert got == [(1, "local"), (6, "local"), (7, "local")]
    assert pair.sub_exec("SELECT count(*) FROM pg_prepared_xacts") == [(0,)]
    assert runner.stop() == 0
    log = runner.log()
    assert not re.findall(r"^\S+ ERROR .*$", log, re.M)
    filtered = "transaction from another origin filtered" in log
    assert filtered == (origin == "none" and pair.pub.version < 16)
