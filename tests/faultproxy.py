"""A small TCP proxy for fault tests: connections that are cut, and connections that stall.

``FaultProxy(port)`` listens on 127.0.0.1 (a free port, :attr:`FaultProxy.port`)
and forwards every connection to 127.0.0.1:``port``, one thread per direction.

* :meth:`FaultProxy.cut` resets every open connection (SO_LINGER 0), as a
  firewall or a peer's crash-and-restart would. A side whose pump thread is
  blocked reading gets its RST only once it sends something: a backend waiting
  for its client (ClientRead) stays connected to the proxy, as behind a
  firewall that resets only the side that talks. The worker must end such an
  abandoned backend itself, or it keeps the replication origin forever.
* :meth:`FaultProxy.stall` freezes every open connection: the proxy keeps both
  sockets open and stops reading and forwarding, so neither end sees an error,
  a FIN or an RST: a half-open connection, or a middlebox that dropped its state.
  The kernel still acknowledges what fits in the socket buffers, so TCP
  keepalives alone do not notice. New connections pass (a NAT entry lost, a
  route that came back), unless ``new=True`` stalls them too.
* :meth:`FaultProxy.resume` lets stalled connections go on (for tests that
  want the stalled peer to come back).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from typing import Self


class _Link:
    """One proxied connection: the client's socket and the server's."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.running = threading.Event()
        self.running.set()
        self.closed = False

    def pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self.running.wait()
                if self.closed:
                    return
                data = src.recv(65536)
                if not data:
                    break
                self.running.wait()  # a stall holds what was read, too
                if self.closed:
                    return
                dst.sendall(data)
        except OSError:
            pass
        self.close(reset=False)

    def close(self, reset: bool) -> None:
        if self.closed:
            return
        self.closed = True
        self.running.set()  # release the pumps
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                if reset:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


class FaultProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._stall_new = False
        self._stopped = False
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True, name="faultproxy").start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            link = _Link(client, server)
            with self._lock:
                self.accepted += 1
                self._links.append(link)
                if self._stall_new:
                    link.running.clear()
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=link.pump, args=(src, dst), daemon=True).start()

    def _open_links(self) -> list[_Link]:
        with self._lock:
            self._links = [link for link in self._links if not link.closed]
            return list(self._links)

    def cut(self) -> int:
        """Reset every open connection; return how many there were."""
        links = self._open_links()
        for link in links:
            link.close(reset=True)
        return len(links)

    def stall(self, new: bool = False) -> int:
        """Freeze every open connection (and new ones with ``new``); return how many."""
        with self._lock:
            self._stall_new = new
        links = self._open_links()
        for link in links:
            link.running.clear()
        return len(links)

    def resume(self) -> None:
        with self._lock:
            self._stall_new = False
        for link in self._open_links():
            link.running.set()

    def close(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self._listener.close()
        for link in self._open_links():
            link.close(reset=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
