"""The sd_notify sender on its own: datagrams, rate limit, watchdog ownership."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from applier.service import Notifier


def test_notifier_protocol_path_socket_and_watchdog_pid(tmp_path: Path) -> None:
    path = Path("/tmp") / f"applier-notify-{os.getpid()}-{tmp_path.name[-8:]}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        server.settimeout(5)
        try:
            n = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "2000000"})
            assert n.watchdog_interval == 2.0
            n.ready("up")
            assert server.recv(1024) == b"READY=1\nSTATUS=up"
            n.watchdog(100.0)
            n.watchdog(100.5)  # within half the interval: not sent
            n.watchdog(101.0)
            n.status("a\nb")
            got = [server.recv(1024) for _ in range(3)]
            assert got == [b"WATCHDOG=1", b"WATCHDOG=1", b"STATUS=a b"]
        finally:
            path.unlink()
    # Another process's watchdog, or none: no keepalives; no socket: nothing at all.
    other = Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval is None
    silent = Notifier({})
    assert not silent.enabled
    silent.ready()
    silent.watchdog()
