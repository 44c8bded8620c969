"""The origin stamp is made inside COMMIT: a session lost before its COMMIT reached
the server must leave the origin where the last commit put it.

PostgreSQL writes the session's origin values into abort records as well, and
advances the origin with them; were the stamp a statement before COMMIT, the
applier dying between the two would make a restart skip a transaction that never
committed. The second case shows that hazard on the server at hand, so the first
one proves something. There is no fallback to that statement for a role that cannot
write the stamp tables: it is refused at start with the GRANT to run.
"""

from __future__ import annotations

import time

import pytest
from conftest import ONE_PAIR, Pair

from applier.apply.target.session import TargetSession
from applier.apply.target.stamp import PREPARE_STAMP, stamp_params
from applier.errors import PermanentError
from applier.lsn import Lsn, now_pg_timestamp
from applier.schema import upgrade_target

#: The unsafe stamp that earlier versions fell back to: a statement before COMMIT.
_STATEMENT_STAMP = (
    b"SELECT pg_catalog.pg_replication_origin_xact_setup($1::pg_catalog.pg_lsn, "
    b"$2::pg_catalog.timestamptz)"
)


def _progress(pair: Pair, origin: str) -> str | None:
    rows = pair.sub_exec(f"SELECT pg_replication_origin_progress('{origin}', false)::text")
    value = rows[0][0]
    return None if value is None else str(value)


@pytest.mark.parametrize("in_commit", [True, False], ids=["in_commit", "statement"])
@ONE_PAIR
def test_session_lost_before_commit_leaves_origin_alone(pair: Pair, in_commit: bool) -> None:
    origin = f"stamp_{pair.sub_db}"  # origins are per cluster, shared by the tests
    upgrade_target(pair.sub_dsn)
    pair.sub_exec(f"CREATE TABLE t (id int); SELECT pg_replication_origin_create('{origin}')")
    session = TargetSession(pair.sub_dsn, origin, "on")
    _with_temp_objects(session)
    try:

        def commit_one(end_lsn: Lsn, row: int) -> None:
            session.begin()
            session.execute_sql(f"INSERT INTO public.t VALUES ({row})".encode(), "insert")
            session.commit(end_lsn, now_pg_timestamp(), lambda local: None, wait=True)

        commit_one(Lsn(0x5000000), 1)
        assert _progress(pair, origin) == "0/5000000"
        # The next transaction gets as far as its stamp; then the session is gone.
        session.begin()
        session.execute_sql(b"INSERT INTO public.t VALUES (2)", "insert")
        if in_commit:
            session._stamp(Lsn(0x6000000), now_pg_timestamp())
        else:
            stamp = stamp_params(Lsn(0x6000000), now_pg_timestamp())
            session._send_ctl(_STATEMENT_STAMP, "stamp", stamp)
        _lose_session_after(session, pair)
    finally:
        session.close()
    assert pair.sub_exec("SELECT id FROM t") == [(1,)]
    assert pair.sub_exec("SELECT count(*) FROM applier.commit_stamp") == [(0,)]
    progress = _progress(pair, origin)
    pair.sub_exec(f"SELECT pg_replication_origin_drop('{origin}')")
    if in_commit:
        assert progress == "0/5000000"
    else:  # the hazard the in-COMMIT stamp exists for
        assert progress == "0/6000000"


def _with_temp_objects(session: TargetSession) -> None:
    """Give the backend temporary objects: their clean-up at exit aborts the open
    transaction while the session still holds the origin, which is when the abort
    record advances it (without them the origin is released first). The statement
    stamp's hazard shows then; the in-COMMIT stamp must hold either way."""
    session.conn.execute("CREATE TEMPORARY TABLE applier_test_tmp (x int)")


def _lose_session_after(session: TargetSession, pair: Pair) -> None:
    """Wait until every queued statement ran, then terminate the session's backend."""
    session.pg.send_flush_request()  # results now, not at a Sync
    deadline = time.monotonic() + 10
    while session._q and time.monotonic() < deadline:  # every result in: executed
        session.poll()
        time.sleep(0.01)
    assert not session._q
    pid = session.conn.info.backend_pid
    pair.sub_exec(f"SELECT pg_terminate_backend({pid})")
    deadline = time.monotonic() + 10
    while pair.sub_exec(f"SELECT 1 FROM pg_stat_activity WHERE pid = {pid}"):
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.parametrize("in_prepare", [True, False], ids=["in_prepare", "statement"])
@ONE_PAIR
def test_session_lost_before_prepare_leaves_origin_alone(pair: Pair, in_prepare: bool) -> None:
    """Two-phase: the stamp is made inside PREPARE TRANSACTION (migration 0003)."""
    origin = f"stamp_{pair.sub_db}"
    upgrade_target(pair.sub_dsn)
    pair.sub_exec(f"CREATE TABLE t (id int); SELECT pg_replication_origin_create('{origin}')")
    session = TargetSession(pair.sub_dsn, origin, "on")
    _with_temp_objects(session)
    gid = f"g_{pair.sub_db}"
    try:
        session.begin()
        session.execute_sql(b"INSERT INTO public.t VALUES (1)", "insert")
        session.prepare(gid, Lsn(0x5000000), now_pg_timestamp())
        assert _progress(pair, origin) == "0/5000000"
        session.finish_prepared(gid, True, Lsn(0x5000100), now_pg_timestamp())
        assert _progress(pair, origin) == "0/5000100"
        # The next transaction gets as far as the stamp of its PREPARE; then the
        # session is gone.
        session.begin()
        session.execute_sql(b"INSERT INTO public.t VALUES (2)", "insert")
        if in_prepare:
            session._send_ctl(PREPARE_STAMP, "stamp", stamp_params(Lsn(0x6000000), 0))
        else:
            stamp = stamp_params(Lsn(0x6000000), now_pg_timestamp())
            session._send_ctl(_STATEMENT_STAMP, "stamp", stamp)
        _lose_session_after(session, pair)
    finally:
        session.close()
    assert pair.sub_exec("SELECT id FROM t") == [(1,)]
    assert pair.sub_exec("SELECT count(*) FROM applier.prepare_stamp") == [(0,)]
    progress = _progress(pair, origin)
    pair.sub_exec(f"SELECT pg_replication_origin_drop('{origin}')")
    if in_prepare:
        assert progress == "0/5000100"
    else:  # the hazard the in-PREPARE stamp exists for
        assert progress == "0/6000000"


@pytest.mark.parametrize("verb", ["commit", "prepare"])
def test_backend_lost_inside_commit_leaves_origin_alone(pair: Pair, verb: str) -> None:
    """The backend is terminated *inside* COMMIT (or PREPARE TRANSACTION), while the
    stamp's trigger runs: nothing between the stamp and the commit record may let
    the termination in, or the abort record moves the origin past a transaction that
    never committed (a fast shutdown of the target does the same to every backend).

    A committed row in the stamp table, locked by another session, holds the
    trigger's clean-up there; the stamp must come after it.
    """
    origin, table = f"stamp_{pair.sub_db}", f"applier.{verb}_stamp"
    upgrade_target(pair.sub_dsn)
    pair.sub_exec(f"CREATE TABLE t (id int); SELECT pg_replication_origin_create('{origin}')")
    session = TargetSession(pair.sub_dsn, origin, "on")
    _with_temp_objects(session)
    locker = pair.sub_conn(autocommit=False)
    try:
        session.begin()
        session.execute_sql(b"INSERT INTO public.t VALUES (1)", "insert")
        session.commit(Lsn(0x5000000), now_pg_timestamp(), lambda local: None, wait=True)
        assert _progress(pair, origin) == "0/5000000"
        pair.sub_exec(
            f"ALTER TABLE {table} DISABLE TRIGGER {verb}_stamp;"
            f"INSERT INTO {table} VALUES ('0/1', now());"
            f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {verb}_stamp"
        )
        locker.execute(f"SELECT 1 FROM {table} FOR UPDATE")  # held: not committed
        session.begin()
        session.execute_sql(b"INSERT INTO public.t VALUES (2)", "insert")
        if verb == "commit":
            session.commit(Lsn(0x6000000), now_pg_timestamp(), lambda local: None)
        else:
            session._send_ctl(PREPARE_STAMP, "stamp", stamp_params(Lsn(0x6000000), 0))
            session._send_ctl(f"PREPARE TRANSACTION 'g_{pair.sub_db}'".encode(), "prepare")
            session.pg.send_flush_request()
            session.pg.flush()
        pid = session.conn.info.backend_pid
        _wait_for_lock_wait(pair, pid)
        pair.sub_exec(f"SELECT pg_terminate_backend({pid})")
        deadline = time.monotonic() + 10
        while pair.sub_exec(f"SELECT 1 FROM pg_stat_activity WHERE pid = {pid}"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        locker.close()
        session.close()
    progress = _progress(pair, origin)
    pair.sub_exec(f"SELECT pg_replication_origin_drop('{origin}')")
    assert pair.sub_exec("SELECT id FROM t") == [(1,)]
    assert pair.sub_exec("SELECT count(*) FROM pg_prepared_xacts") == [(0,)]
    assert progress == "0/5000000"


def _wait_for_lock_wait(pair: Pair, pid: int) -> None:
    deadline = time.monotonic() + 10
    while not pair.sub_exec(
        f"SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event_type = 'Lock'"
    ):
        assert time.monotonic() < deadline, pair.sub_exec(
            "SELECT state, wait_event_type, wait_event, query "
            f"FROM pg_stat_activity WHERE pid = {pid}"
        )
        time.sleep(0.02)


def test_role_without_temporary_privilege_stamps_inside_commit(pair: Pair) -> None:
    """A non-superuser without TEMPORARY on the target database: a role that may not
    write the stamp tables is refused at start with the GRANT to run (never stamped
    by a statement before COMMIT); granted, it stamps inside COMMIT, and a session
    lost right before its COMMIT leaves the origin alone."""
    origin, role = f"stamp_{pair.sub_db}", f"nt_{pair.sub_db}"
    upgrade_target(pair.sub_dsn)  # as the superuser: the role does not own the schema
    pair.sub_exec(
        f"CREATE TABLE t (id int); SELECT pg_replication_origin_create('{origin}');"
        f"CREATE ROLE {role} LOGIN; GRANT ALL ON t TO {role};"
        "GRANT EXECUTE ON FUNCTION pg_replication_origin_session_setup(text),"
        " pg_replication_origin_xact_setup(pg_lsn, timestamptz),"
        " pg_replication_origin_xact_reset(), pg_replication_origin_advance(text, pg_lsn),"
        " pg_replication_origin_session_progress(boolean),"
        f" pg_replication_origin_session_reset() TO {role};"
        f"GRANT SET ON PARAMETER session_replication_role TO {role};"
        f"REVOKE TEMPORARY ON DATABASE {pair.sub_db} FROM PUBLIC"
    )
    dsn = pair.sub.dsn(pair.sub_db, user=role)
    try:
        with pytest.raises(PermanentError) as refused:
            TargetSession(dsn, origin, "on")
        text = f"{refused.value} {refused.value.hint}"
        assert "applier.commit_stamp" in text and "GRANT USAGE ON SCHEMA applier" in text
        assert f"TO {role}" in text or f'TO "{role}"' in text
        pair.sub_exec(
            f"GRANT USAGE ON SCHEMA applier TO {role};"
            f"GRANT INSERT, DELETE ON applier.commit_stamp, applier.prepare_stamp TO {role}"
        )
        session = TargetSession(dsn, origin, "on")
        try:
            session.begin()
            session.execute_sql(b"INSERT INTO public.t VALUES (1)", "insert")
            session.commit(Lsn(0x7000000), now_pg_timestamp(), lambda local: None, wait=True)
            assert _progress(pair, origin) == "0/7000000"
            session.begin()
            session.execute_sql(b"INSERT INTO public.t VALUES (2)", "insert")
            session._stamp(Lsn(0x8000000), now_pg_timestamp())
            _lose_session_after(session, pair)
        finally:
            session.close()
        assert pair.sub_exec("SELECT id FROM t") == [(1,)]
        assert _progress(pair, origin) == "0/7000000"
    finally:
        pair.sub_exec(
            f"SELECT pg_replication_origin_drop('{origin}'); DROP OWNED BY {role}; DROP ROLE {role}"
        )
