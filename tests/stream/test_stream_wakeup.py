"""A wake-up socket ends the stream's wait at once (what SIGTERM/SIGHUP of
``applier run`` write to, see applier.service.signal_wakeup).

Without it a read of an idle stream waits its whole timeout: the test asks for
30 s and expects the read back within a few, so it fails if the wake-up is
ignored, with a wide margin for a loaded machine.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from applier.localpg import LocalCluster
from applier.service import signal_wakeup
from applier.stream import LogicalStream, ReplicationConnection, StreamOptions


def _idle_stream(cluster: LocalCluster, db: str, wakeup: socket.socket) -> LogicalStream:
    cluster.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t", db)
    slot = f"w_{db}"
    with ReplicationConnection.open(cluster.dsn(db)) as rc:
        rc.create_slot(slot)
    conn = ReplicationConnection.open(cluster.dsn(db))
    stream = LogicalStream(conn, StreamOptions(slot=slot, publications=["pub"], timeout=60.0))
    stream.wake_on(wakeup)
    stream.start()
    return stream


@pytest.mark.parametrize("publisher", [15], indirect=True)
def test_a_signal_ends_the_wait_and_the_stream_goes_on(
    publisher: tuple[LocalCluster, str],
) -> None:
    cluster, db = publisher
    got: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    try:
        with signal_wakeup() as wakeup:
            stream = _idle_stream(cluster, db, wakeup)
            try:
                timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1))
                timer.start()
                started = time.monotonic()
                assert stream.read(30) == []
                waited = time.monotonic() - started
                timer.join()
                assert got == [signal.SIGUSR1]
                assert waited < 10, waited
                # The byte was read: the next read waits (and sees a change) as usual.
                cluster.execute("INSERT INTO t VALUES (1)", db)
                deadline = time.monotonic() + 30
                msgs = []
                while not msgs and time.monotonic() < deadline:
                    msgs = stream.read(1)
                assert msgs, "no message after the wake-up"
            finally:
                stream.stop()
    finally:
        signal.signal(signal.SIGUSR1, old)
