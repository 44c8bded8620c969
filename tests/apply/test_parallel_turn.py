"""The commit turn (applier.apply.parallel.turn) with real target sessions.

Two sessions of an origin group, each on its own thread: the later transaction
is applied first and waits for its turn; the commit records land in source
order (each member's ``local_lsn`` says where its commit went in the target's
WAL). A session lost before its COMMIT breaks the turn: the later one rolls
back and the restart point stays where the last committed one left it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from conftest import Pair

from applier.apply.parallel.origins import create_group, member, restart_point
from applier.apply.parallel.turn import CommitTurn, TurnBroken
from applier.apply.target.session import TargetSession
from applier.errors import ApplierError
from applier.lsn import Lsn, now_pg_timestamp
from applier.pgconn import connect
from applier.schema import upgrade_target

E1, E2 = Lsn(0x1000000), Lsn(0x2000000)


def _sessions(pair: Pair) -> tuple[str, TargetSession, TargetSession]:
    origin = f"o_{pair.pub_db}"
    upgrade_target(pair.sub_dsn)
    pair.sub_exec("CREATE TABLE t (id int PRIMARY KEY)")
    with connect(pair.sub_dsn, side="target", purpose="applier test") as admin:
        create_group(admin, origin, 2)
    a = TargetSession(pair.sub_dsn, member(origin, 1), "on")
    b = TargetSession(pair.sub_dsn, member(origin, 2), "on")
    return origin, a, b


def commit_in_turn(
    session: TargetSession,
    turn: CommitTurn,
    seq: int,
    end_lsn: Lsn,
    commit_ts: int,
    done: Callable[[Lsn], None],
) -> None:
    """What a member does around COMMIT (member.py, through its Applier): wait for
    the turn, roll back if it broke, COMMIT with the stamp and wait for it, break the
    turn if that fails, else pass it on."""
    try:
        turn.wait(seq)
    except TurnBroken:
        session.rollback()
        raise
    try:
        session.commit(end_lsn, commit_ts, done, wait=True)
    except BaseException as e:
        turn.broken(f"transaction {seq} (end {end_lsn}) failed to commit: {e}")
        raise
    turn.done(seq)


def _apply(s: TargetSession, row: int) -> None:
    s.begin()
    s.execute_sql(f"INSERT INTO public.t VALUES ({row})".encode(), "insert")


def _later(b: TargetSession, turn: CommitTurn, errors: list[BaseException]) -> threading.Thread:
    """T2 on session B, committed in its turn on a thread of its own."""

    def run() -> None:
        try:
            commit_in_turn(b, turn, 2, E2, now_pg_timestamp(), lambda local: None)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _local_lsn(pair: Pair, name: str) -> Lsn:
    row = pair.sub_exec(
        f"SELECT local_lsn::text FROM pg_replication_origin_status WHERE external_id = '{name}'"
    )
    return Lsn.parse(str(row[0][0]))


def test_the_later_transaction_commits_after_the_earlier(pair: Pair) -> None:
    origin, a, b = _sessions(pair)
    turn, errors = CommitTurn(), list[BaseException]()
    try:
        _apply(a, 1)
        _apply(b, 2)
        thread = _later(b, turn, errors)
        time.sleep(0.3)  # room for B to commit out of turn, were it let
        assert pair.sub_exec("SELECT id FROM t") == []  # B waits for its turn
        commit_in_turn(a, turn, 1, E1, now_pg_timestamp(), lambda local: None)
        thread.join(30)
        assert not thread.is_alive() and errors == []
    finally:
        a.close()
        b.close()
    assert [r[0] for r in pair.sub_exec("SELECT id FROM t ORDER BY id")] == [1, 2]
    assert turn.committed == 2
    # Commit records in source order: T1's before T2's in the target's WAL.
    assert _local_lsn(pair, member(origin, 1)) < _local_lsn(pair, member(origin, 2))
    with connect(pair.sub_dsn, side="target", purpose="applier test") as admin:
        assert restart_point(admin, origin) == E2


def test_a_lost_session_breaks_the_turn(pair: Pair) -> None:
    """A's backend is terminated before its COMMIT: T1 fails, so T2 must not commit."""
    origin, a, b = _sessions(pair)
    turn, errors = CommitTurn(), list[BaseException]()
    try:
        _apply(a, 1)
        _apply(b, 2)
        thread = _later(b, turn, errors)
        a.settle()
        pair.sub_exec(f"SELECT pg_terminate_backend({a.conn.info.backend_pid})")
        with pytest.raises(ApplierError):
            commit_in_turn(a, turn, 1, E1, now_pg_timestamp(), lambda local: None)
        thread.join(30)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], TurnBroken)
        assert not b.in_txn  # rolled back
        with pytest.raises(TurnBroken):
            turn.wait(3)  # and no later one either
    finally:
        a.close()
        b.close()
    assert pair.sub_exec("SELECT id FROM t") == []
    with connect(pair.sub_dsn, side="target", purpose="applier test") as admin:
        assert restart_point(admin, origin) == Lsn(0)  # both are resent


_SLOW_COMMIT = """
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM pg_catalog.pg_sleep(1); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON t DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION public.slow_commit();
ALTER TABLE t ENABLE ALWAYS TRIGGER slow_commit;
"""


def test_a_commit_that_returns_after_a_later_one_broke_the_turn_counts(pair: Pair) -> None:
    """A sends T1's COMMIT in its turn; while it runs (a deferred trigger sleeps in it),
    the session of a later transaction is lost and breaks the turn. T1 committed, in
    order: done() records it (the restart point is after it) instead of failing."""
    origin, a, b = _sessions(pair)
    pair.sub_exec(_SLOW_COMMIT)
    turn = CommitTurn()
    try:
        _apply(a, 1)
        breaker = threading.Timer(0.3, turn.broken, ("session B: lost its connection",))
        breaker.start()
        commit_in_turn(a, turn, 1, E1, now_pg_timestamp(), lambda local: None)
        breaker.join()
        assert turn.committed == 1
        with pytest.raises(TurnBroken):
            turn.wait(2)  # no later one commits
    finally:
        a.close()
        b.close()
    assert pair.sub_exec("SELECT id FROM t") == [(1,)]
    with connect(pair.sub_dsn, side="target", purpose="applier test") as admin:
        assert restart_point(admin, origin) == E1
