"""Faults: a restarting publisher, a terminated walsender, a silent walsender, refused commands.

Each must raise the right applier error quickly with a clear message, never hang.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import pytest
from conftest import Pair
from streamkit import emit_marker, open_stream, read_until_marker, slot_position

from applier.errors import (
    ApplierError,
    ConnectionLost,
    ServerTimeout,
    SlotExists,
    SlotMissing,
    SourceError,
)
from applier.localpg import LocalCluster
from applier.lsn import Lsn
from applier.stream import LogicalStream, ReplicationConnection, StreamOptions


def _setup(cluster: LocalCluster, db: str, slot: str) -> None:
    cluster.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t", db)
    with ReplicationConnection.open(cluster.dsn(db)) as rc:
        rc.create_slot(slot)


def _read_until_error(stream: LogicalStream, limit: float) -> BaseException:
    deadline = time.monotonic() + limit
    with pytest.raises(ApplierError) as info:
        while time.monotonic() < deadline:
            stream.read(0.2)
    return info.value


def _walsender_pid(cluster: LocalCluster, db: str, slot: str) -> int:
    for _ in range(100):
        row = cluster.execute(
            f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{slot}'", db
        )
        if row and row[0][0]:
            return int(row[0][0])
        time.sleep(0.05)
    raise AssertionError("no walsender on the slot")


def test_walsender_terminated(publisher: tuple[LocalCluster, str]) -> None:
    cluster, db = publisher
    slot = f"k_{db}"
    _setup(cluster, db, slot)
    stream = open_stream(cluster, db, slot)
    try:
        pid = _walsender_pid(cluster, db, slot)
        cluster.execute(f"SELECT pg_terminate_backend({pid})", db)
        t0 = time.monotonic()
        err = _read_until_error(stream, 10)
        assert time.monotonic() - t0 < 5
    finally:
        stream.stop()
    assert isinstance(err, ConnectionLost)
    assert "terminat" in str(err) and "hint:" in str(err)


def test_silent_walsender_times_out(publisher: tuple[LocalCluster, str]) -> None:
    cluster, db = publisher
    slot = f"q_{db}"
    _setup(cluster, db, slot)
    stream = open_stream(cluster, db, slot, timeout=2.0, status_interval=0.5)
    pid = _walsender_pid(cluster, db, slot)
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        err = _read_until_error(stream, 10)
        elapsed = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
        stream.stop()
    assert isinstance(err, ServerTimeout), err
    assert 1.5 <= elapsed < 4, elapsed
    assert "sent nothing" in str(err) and "timeout 2s" in str(err)


def test_idle_server_is_not_a_timeout(publisher: tuple[LocalCluster, str]) -> None:
    """An idle but healthy walsender answers our pings: no ServerTimeout."""
    cluster, db = publisher
    slot = f"i_{db}"
    _setup(cluster, db, slot)
    stream = open_stream(cluster, db, slot, timeout=1.0, status_interval=5.0)
    try:
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            assert stream.read(0.3) == []
        assert stream.keepalives_received >= 2
    finally:
        stream.stop()


def test_publisher_restart(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair(15, 15)
    slot = f"r_{pair.pub_db}"
    _setup(pair.pub, pair.pub_db, slot)
    stream = open_stream(pair.pub, pair.pub_db, slot)
    restarter = threading.Thread(target=pair.pub.restart)
    try:
        t0 = time.monotonic()
        restarter.start()
        err = _read_until_error(stream, 30)
        assert time.monotonic() - t0 < 15
    finally:
        restarter.join(60)
        stream.stop()
    assert isinstance(err, ConnectionLost), err
    assert "hint:" in str(err)
    # The slot is still usable after the restart.
    pair.pub_exec("INSERT INTO t VALUES (1)")
    emit_marker(pair.pub, pair.pub_db)
    again = open_stream(pair.pub, pair.pub_db, slot)
    try:
        assert any(m.kind == "insert" for _, m in read_until_marker(again))
    finally:
        again.stop()


def test_confirm_advances_the_slot_only_to_the_confirmed_lsn(
    publisher: tuple[LocalCluster, str],
) -> None:
    cluster, db = publisher
    slot = f"c_{db}"
    _setup(cluster, db, slot)
    cluster.execute("INSERT INTO t VALUES (1)", db)
    cluster.execute("INSERT INTO t VALUES (2)", db)
    emit_marker(cluster, db)
    before = slot_position(cluster, db, slot)
    stream = open_stream(cluster, db, slot)
    try:
        items = read_until_marker(stream)
        first_commit = next(lsn for lsn, m in items if m.kind == "commit")
        assert stream.last_received > first_commit
        stream.send_status()
        time.sleep(0.3)
        assert slot_position(cluster, db, slot) == before  # received is not flushed
        stream.confirm(first_commit)
        stream.confirm(Lsn(first_commit - 8))  # never moves back
        assert stream.confirmed == first_commit
        stream.send_status()
        _wait_for(lambda: slot_position(cluster, db, slot) == first_commit)
    finally:
        stream.stop()
    assert slot_position(cluster, db, slot) == first_commit


def _wait_for(cond: Callable[[], bool], limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_slot_commands_and_refusals(publisher: tuple[LocalCluster, str]) -> None:
    cluster, db = publisher
    slot = f"x_{db}"
    with ReplicationConnection.open(cluster.dsn(db)) as rc:
        info = rc.identify_system()
        assert info.dbname == db and info.timeline == 1 and info.xlogpos > 0
        assert rc.server_version // 10000 == cluster.version
        created = rc.create_slot(slot, snapshot="export")
        assert created.snapshot_name and created.output_plugin == "pgoutput"
        assert created.consistent_point >= info.xlogpos
        assert rc.slot_exists(slot) and not rc.slot_exists("nope") and not rc.slot_exists("A'b")
        with pytest.raises(SlotExists):
            rc.create_slot(slot)
        rc.drop_slot(slot)
        with pytest.raises(SlotMissing, match="does not exist") as missing:
            rc.drop_slot(slot)
        assert "create it with" in str(missing.value)
        with pytest.raises(ApplierError, match="proto_version 9"):
            LogicalStream(rc, StreamOptions(slot=slot, publications=["pub"], proto_version=9))
    conn = ReplicationConnection.open(cluster.dsn(db))
    stream = LogicalStream(conn, StreamOptions(slot="no_such_slot", publications=["pub"]))
    with pytest.raises(SlotMissing, match="'no_such_slot' does not exist"):
        stream.start()
    stream.stop()


def test_no_replication_privilege(publisher: tuple[LocalCluster, str]) -> None:
    cluster, db = publisher
    role = f"norepl_{db}"
    cluster.execute(f"CREATE ROLE {role} LOGIN NOREPLICATION", db)
    try:
        with pytest.raises(SourceError, match="REPLICATION attribute"):
            ReplicationConnection.open(cluster.dsn(db, user=role) + " password=secret123")
        try:
            ReplicationConnection.open(cluster.dsn(db, user=role) + " password=secret123")
        except SourceError as e:
            assert "secret123" not in str(e)
    finally:
        cluster.execute(f"DROP ROLE {role}", db)


def test_unreachable_server() -> None:
    from applier.localpg import free_port

    with pytest.raises(ConnectionLost, match="cannot open a replication connection") as info:
        ReplicationConnection.open(f"host=127.0.0.1 port={free_port()} password=hunter2 dbname=x")
    assert "hunter2" not in str(info.value)
