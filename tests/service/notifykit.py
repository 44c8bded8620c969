"""A fake systemd notify socket the test owns: it records every datagram with its arrival time."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Note:
    at: float  # time.monotonic() at arrival
    fields: dict[str, str]

    def has(self, key: str, value: str | None = None) -> bool:
        return key in self.fields and (value is None or self.fields[key] == value)


class NotifySocket:
    """AF_UNIX SOCK_DGRAM in the abstract namespace (``@...``), read by a thread."""

    def __init__(self) -> None:
        self.name = f"@applier-test-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + self.name[1:].encode())
        self.sock.settimeout(0.2)
        self.notes: list[Note] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def env(self, watchdog_usec: int | None = 1_000_000) -> dict[str, str]:
        env = {"NOTIFY_SOCKET": self.name}
        if watchdog_usec:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        return env

    def _read(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(ln.split("=", 1) for ln in data.decode().splitlines() if "=" in ln)
            with self._lock:
                self.notes.append(Note(time.monotonic(), fields))

    def close(self) -> None:
        self._closed = True
        self._thread.join(2)
        self.sock.close()

    def all(self, key: str | None = None, since: float = 0.0, until: float = 1e18) -> list[Note]:
        with self._lock:
            notes = list(self.notes)
        return [n for n in notes if since <= n.at <= until and (key is None or key in n.fields)]

    def wait(
        self,
        pred: Callable[[Note], bool],
        timeout: float = 30,
        since: float = 0.0,
        alive: Callable[[], bool] | None = None,
    ) -> Note:
        deadline = time.monotonic() + timeout
        while True:
            for n in self.all(since=since):
                if pred(n):
                    return n
            if alive is not None and not alive():
                raise AssertionError("the worker exited while waiting for a notification")
            if time.monotonic() > deadline:
                raise AssertionError(f"no such notification in {timeout}s; got {self.all()}")
            time.sleep(0.05)
