"""Reading the stream ahead (applier.stream.readahead) on a real walsender.

What is taken ahead must come back to the reader exactly as it would have
come from libpq: the same messages, in the same order, at the same positions,
whether the read-ahead stopped at its limit or not; and a connection that
breaks while it reads ahead is reported by the reader, not by the read-ahead
(which runs inside the apply pipeline's wait on the target).
"""

from __future__ import annotations

import selectors
import time

import pytest
from streamkit import SMALL_WORK_MEM, emit_marker, open_stream, read_until_marker

from applier import speedups
from applier.errors import ConnectionLost
from applier.localpg import LocalCluster
from applier.protocol import Message
from applier.speedups import readahead as py_readahead
from applier.speedups import takeloop as py_takeloop
from applier.stream import LogicalStream, ReplicationConnection, client, readahead, takeloop

Items = list[tuple[object, object]]


def _setup(cluster: LocalCluster, db: str, slots: list[str]) -> None:
    cluster.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t", db
    )
    for slot in slots:
        with ReplicationConnection.open(cluster.dsn(db)) as rc:
            rc.create_slot(slot)


def _workload(cluster: LocalCluster, db: str) -> None:
    for i in range(1, 41):
        cluster.execute(f"INSERT INTO t VALUES ({i}, repeat('x', {i}))", db)
    cluster.execute("UPDATE t SET v = v || '!' WHERE id % 3 = 0", db)
    # Streamed (logical_decoding_work_mem is 64kB on these connections).
    cluster.execute(
        "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(100, 3100) g;"
        "DELETE FROM t WHERE id % 7 = 0",
        db,
    )
    cluster.execute("UPDATE t SET v = 'last' WHERE id = 1", db)


def _read_with_read_ahead(stream: LogicalStream, seen: dict[str, int]) -> Items:
    """Until the marker: read ahead whenever the socket is readable and there is
    room (as the pipeline does while it waits), and read now and then."""
    out: Items = []
    sel = selectors.DefaultSelector()
    sel.register(stream.socket, selectors.EVENT_READ)
    deadline = time.monotonic() + 60
    turn = 0
    while time.monotonic() < deadline:
        turn += 1
        if sel.select(0.01):  # (what libpq holds already does not wake it)
            # A little more each time: several fills (chunks) wait for one read.
            stream.ahead.limit = stream.ahead.nbytes + 1500
            if not stream.read_ahead():
                seen["full"] += 1
            seen["chunks"] = max(seen["chunks"], len(stream.ahead._chunks))
            if turn % 4:
                continue  # more read ahead than read
        for lsn, msg in stream.read(0):
            if isinstance(msg, Message) and msg.prefix == "marker":
                return out
            out.append((lsn, msg))
    raise AssertionError(f"no marker in 60 s; {len(out)} messages")


@pytest.mark.parametrize("publisher", [15, 18], indirect=True)
@pytest.mark.parametrize(
    ("loop", "batch"),
    [("c", None), ("c", 7), ("python", 7)],
    ids=["c", "c-small-batches", "python-small-batches"],
)
def test_what_is_read_ahead_is_read_as_from_libpq(
    publisher: tuple[LocalCluster, str],
    loop: str,
    batch: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Small batches stop the reader inside a fill: the next read goes on from
    the message after the last one taken, in C and in the Python loop alike."""
    if loop == "c" and speedups.IMPLEMENTATION != "C":
        pytest.skip("pure Python (APPLIER_PURE_PYTHON, or the speedups not built)")
    if loop == "python":  # both loops: the reader's and the fill's
        monkeypatch.setattr(takeloop, "take_xlog", py_takeloop.take_xlog)
        monkeypatch.setattr(readahead, "fill_copy", py_readahead.fill_copy)
    if batch is not None:
        monkeypatch.setattr(client, "MAX_BATCH", batch)
    cluster, db = publisher
    _setup(cluster, db, ["plain", "ahead"])
    _workload(cluster, db)
    emit_marker(cluster, db)
    opts = {"options": SMALL_WORK_MEM, "streaming": "on"}
    plain = open_stream(cluster, db, "plain", **opts)  # type: ignore[arg-type]
    ahead = open_stream(cluster, db, "ahead", **opts)  # type: ignore[arg-type]
    seen = {"full": 0, "chunks": 0}
    try:
        want = read_until_marker(plain)
        got = _read_with_read_ahead(ahead, seen)
    finally:
        plain.stop()
        ahead.stop()
    assert [(int(lsn), repr(msg)) for lsn, msg in got] == [
        (int(lsn), repr(msg)) for lsn, msg in want
    ]
    assert len(want) > 3000
    assert seen["full"] > 0, seen  # the limit was reached and the reader went on
    assert seen["chunks"] >= 3, seen  # several fills were read back in order
    assert ahead.ahead.taken > 0
    assert not ahead.ahead  # everything taken ahead was read


def _fill_loop(loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fill's loop: "c" (fill_copy) or "python" (its Python twin)."""
    if loop == "c" and speedups.IMPLEMENTATION != "C":
        pytest.skip("pure Python (APPLIER_PURE_PYTHON, or the speedups not built)")
    if loop == "python":
        monkeypatch.setattr(readahead, "fill_copy", py_readahead.fill_copy)


@pytest.mark.parametrize("publisher", [15], indirect=True)
@pytest.mark.parametrize("loop", ["c", "python"])
def test_a_connection_lost_while_reading_ahead_is_the_readers_error(
    publisher: tuple[LocalCluster, str], loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill_loop(loop, monkeypatch)
    cluster, db = publisher
    _setup(cluster, db, ["gone"])
    stream = open_stream(cluster, db, "gone")
    try:
        cluster.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE slot_name = 'gone'",
            db,
        )
        deadline = time.monotonic() + 10
        while stream.ahead.room and time.monotonic() < deadline:
            stream.read_ahead()  # never raises
            time.sleep(0.05)
        assert stream.ahead.stopped
        with pytest.raises(ConnectionLost):
            for _ in range(20):
                stream.read(0.5)
    finally:
        stream.conn.close()


@pytest.mark.parametrize("publisher", [18], indirect=True)
@pytest.mark.parametrize("loop", ["c", "python"])
def test_one_fill_takes_what_the_socket_holds(
    publisher: tuple[LocalCluster, str], loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fill reads until libpq gives no message, not one libpq buffer (16 kB at
    first): the walsender's next block is decoded only once it sent this one."""
    _fill_loop(loop, monkeypatch)
    cluster, db = publisher
    _setup(cluster, db, ["full"])
    cluster.execute("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g", db)
    stream = open_stream(cluster, db, "full")
    try:
        sel = selectors.DefaultSelector()
        sel.register(stream.socket, selectors.EVENT_READ)
        assert sel.select(10), "the walsender sent nothing in 10 s"
        time.sleep(1.0)  # it decodes 20,000 rows and fills the socket meanwhile
        stream.read_ahead()
        held = stream.ahead.nbytes
        assert held > 256 * 1024, held
        assert len(stream.ahead._chunks) == 1
    finally:
        stream.stop()
