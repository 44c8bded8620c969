"""The origin group of parallel apply on real targets (PostgreSQL 15 and 18).

Before PostgreSQL 19 each apply session holds an origin of its own
(``<origin>.1 .. .N``) and the restart point is the largest progress among them
and the plain origin (applier.apply.parallel.origins has the proof). Here:
creating, reading and dropping the group, a restart point after the members
advanced unequally, and the proof's cases played with real target sessions
committing in order through the in-COMMIT stamp: a session lost after its
commit, and one lost before its commit reached the server while the other
session holds the previous transaction's position; and an immediate stop of
the target after ordered commits with synchronous_commit off keeping a prefix
and its restart point. PostgreSQL 19's shared
origin is not available on this machine: only its version switch is tested.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest
from conftest import Pair

from applier.apply.parallel.origins import (
    create_group,
    drop_group,
    group_progress,
    member,
    restart_point,
    setup_session,
    shares_origin,
)
from applier.apply.target.session import TargetSession
from applier.lsn import Lsn, now_pg_timestamp
from applier.pgconn import connect
from applier.schema import upgrade_target


def _advance(pair: Pair, name: str, lsn: str) -> None:
    pair.sub_exec(f"SELECT pg_replication_origin_advance('{name}', '{lsn}')")


def test_group_create_read_drop(pair: Pair) -> None:
    origin = f"o_{pair.pub_db}"  # origins are per cluster; the fixture drops these
    with connect(pair.sub_dsn, side="target", purpose="applier test") as conn:
        assert create_group(conn, origin, 3) == [member(origin, i) for i in (1, 2, 3)]
        assert create_group(conn, origin, 4) == [member(origin, 4)]
        assert restart_point(conn, origin) == Lsn(0)  # nothing anywhere yet
        # Not members: another name that starts alike, and the plain origin.
        pair.sub_exec(
            f"SELECT pg_replication_origin_create('{origin}_x'), "
            f"pg_replication_origin_create('{origin}x_1'), "
            f"pg_replication_origin_create('{origin}')"
        )
        _advance(pair, f"{origin}_x", "9/0")
        _advance(pair, f"{origin}x_1", "9/0")
        # The sessions' origins advanced unequally: the largest is the restart point.
        _advance(pair, member(origin, 1), "0/3000000")
        _advance(pair, member(origin, 3), "0/5000000")
        _advance(pair, origin, "0/1000000")
        assert group_progress(conn, origin) == {
            member(origin, 1): Lsn(0x3000000),
            member(origin, 2): Lsn(0),
            member(origin, 3): Lsn(0x5000000),
            member(origin, 4): Lsn(0),
        }
        assert restart_point(conn, origin) == Lsn(0x5000000)
        # The plain origin (a run with one session after the group's) counts too.
        _advance(pair, origin, "0/6000000")
        assert restart_point(conn, origin) == Lsn(0x6000000)
        assert sorted(drop_group(conn, origin)) == [member(origin, i) for i in (1, 2, 3, 4)]
        assert group_progress(conn, origin) == {}
        left = {r[0] for r in pair.sub_exec("SELECT roname FROM pg_replication_origin")}
        assert {origin, f"{origin}_x", f"{origin}x_1"} <= left


def test_another_workers_origin_is_never_a_member(pair: Pair) -> None:
    """Config names origins with [a-z0-9_], and the default origin is the slot's
    name: two workers ``a`` and ``a_2``, or ``pg`` beside a built-in subscription's
    ``pg_16384``, are legal today. Reading ``a``'s restart point (every start of
    ``run``) must never take another worker's position for its own."""
    origin = f"o_{pair.pub_db}"
    with connect(pair.sub_dsn, side="target", purpose="applier test") as conn:
        pair.sub_exec(
            f"SELECT pg_replication_origin_create('{origin}'), "
            f"pg_replication_origin_create('{origin}_2')"
        )
        _advance(pair, origin, "0/1000000")
        _advance(pair, f"{origin}_2", "9/0")  # another worker's stream, far ahead
        assert restart_point(conn, origin) == Lsn(0x1000000)
        assert group_progress(conn, origin) == {}
        assert drop_group(conn, origin) == []
        assert member(origin, 2) != f"{origin}_2"


def test_sessions_hold_their_own_members(pair: Pair) -> None:
    """One backend per origin before 19 (why the group): a member taken by one
    session cannot be taken by another, and a live member cannot be dropped."""
    origin = f"o_{pair.pub_db}"
    with (
        connect(pair.sub_dsn, side="target", purpose="applier test") as admin,
        connect(pair.sub_dsn, side="target", purpose="applier test 1") as s1,
        connect(pair.sub_dsn, side="target", purpose="applier test 2") as s2,
    ):
        version = s1.info.server_version
        assert not shares_origin(version)
        create_group(admin, origin, 2)
        assert setup_session(s1, origin, 1) == member(origin, 1)
        assert setup_session(s2, origin, 2) == member(origin, 2)
        with pytest.raises(psycopg.errors.ObjectInUse):
            setup_session(admin, origin, 1)
        with pytest.raises(psycopg.errors.ObjectInUse):
            drop_group(admin, origin)
        s1.execute("SELECT pg_catalog.pg_replication_origin_session_reset()")
        s2.execute("SELECT pg_catalog.pg_replication_origin_session_reset()")
        assert len(drop_group(admin, origin)) == 2
    assert shares_origin(190000) and not shares_origin(189999)


def _lose(session: TargetSession, pair: Pair) -> None:
    """Terminate the session's backend once what it was sent has run."""
    session.pg.send_flush_request()
    deadline = time.monotonic() + 10
    while session._q and time.monotonic() < deadline:
        session.poll()
        time.sleep(0.01)
    pid = session.conn.info.backend_pid
    pair.sub_exec(f"SELECT pg_terminate_backend({pid})")
    while pair.sub_exec(f"SELECT 1 FROM pg_stat_activity WHERE pid = {pid}"):
        assert time.monotonic() < deadline + 10
        time.sleep(0.05)


@pytest.mark.parametrize("a_committed", [True, False], ids=["after_commit", "before_commit"])
def test_a_session_lost_between_its_commit_and_its_successors(
    pair: Pair, a_committed: bool
) -> None:
    """T1 on session B, T2 on A, T3 on B, committed in this order, each stamped
    inside its COMMIT. A is lost either after T2 committed or with T2's stamp made
    but its COMMIT never sent; B has T3 applied and waits for its turn, so the
    leader stops it (rolled back). The restart point is E2 or E1: T2 is resent
    exactly when it did not commit, and T3 always."""
    origin = f"o_{pair.pub_db}"
    upgrade_target(pair.sub_dsn)
    pair.sub_exec("CREATE TABLE t (id int PRIMARY KEY)")
    with connect(pair.sub_dsn, side="target", purpose="applier test") as admin:
        create_group(admin, origin, 2)
    a = TargetSession(pair.sub_dsn, member(origin, 1), "on")
    b = TargetSession(pair.sub_dsn, member(origin, 2), "on")
    # Temporary objects: an abort at exit then runs while the origin is held.
    a.conn.execute("CREATE TEMPORARY TABLE applier_test_tmp (x int)")
    b.conn.execute("CREATE TEMPORARY TABLE applier_test_tmp (x int)")
    e1, e2, e3 = Lsn(0x1000000), Lsn(0x2000000), Lsn(0x3000000)
    try:

        def apply(s: TargetSession, row: int) -> None:
            s.begin()
            s.execute_sql(f"INSERT INTO public.t VALUES ({row})".encode(), "insert")

        apply(b, 1)
        b.commit(e1, now_pg_timestamp(), lambda local: None, wait=True)
        apply(a, 2)
        apply(b, 3)  # applied at once: no shared key with T2
        if a_committed:
            a.commit(e2, now_pg_timestamp(), lambda local: None, wait=True)
        else:
            a._stamp(e2, now_pg_timestamp())  # as far as the stamp; COMMIT never sent
        _lose(a, pair)
        _lose(b, pair)  # the leader stops the others at a transaction boundary
    finally:
        a.close()
        b.close()
    rows = [r[0] for r in pair.sub_exec("SELECT id FROM t ORDER BY id")]
    with connect(pair.sub_dsn, side="target", purpose="applier test") as admin:
        point = restart_point(admin, origin)
        members = group_progress(admin, origin)
    if a_committed:
        assert (rows, point) == ([1, 2], e2)
        assert members == {member(origin, 1): e2, member(origin, 2): e1}
    else:
        assert (rows, point) == ([1], e1)
        assert members == {member(origin, 1): Lsn(0), member(origin, 2): e1}
    assert e3 > point  # T3 is resent either way


@pytest.mark.parametrize("version", [15, 18])
def test_an_immediate_stop_keeps_a_prefix_and_its_restart_point(
    make_pair: Callable[..., Pair], version: int
) -> None:
    """Two sessions commit T1..T200 in order, alternately, with synchronous_commit
    off (a commit returns before its WAL is flushed), then the target stops
    immediately: what survives is a prefix T1..Tm of the order (commit records
    are in the WAL in commit order), and the group's restart point is E_m."""
    pair = make_pair(15, version)
    origin = f"o_{pair.pub_db}"
    upgrade_target(pair.sub_dsn)
    pair.sub_exec("CREATE TABLE t (id int PRIMARY KEY)")
    with connect(pair.sub_dsn, side="target", purpose="applier test") as admin:
        create_group(admin, origin, 2)
    sessions = [TargetSession(pair.sub_dsn, member(origin, i), "off") for i in (1, 2)]
    try:
        for k in range(1, 201):
            s = sessions[k % 2]
            s.begin()
            s.execute_sql(f"INSERT INTO public.t VALUES ({k})".encode(), "insert")
            s.commit(Lsn(k << 20), now_pg_timestamp(), lambda local: None, wait=True)
        pair.sub.stop("immediate")
    finally:
        for s in sessions:
            s.close()
    pair.sub.start()
    rows = [r[0] for r in pair.sub_exec("SELECT id FROM t ORDER BY id")]
    m = len(rows)
    assert rows == list(range(1, m + 1))
    with connect(pair.sub_dsn, side="target", purpose="applier test") as admin:
        assert restart_point(admin, origin) == Lsn(m << 20)
