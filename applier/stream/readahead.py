"""Reading the stream ahead while the apply worker waits on the target.

While the worker waits for the target (its socket full, or results owed), the
replication socket is not read. The walsender then blocks in its send, and a
streamed transaction shows why that costs: the walsender decodes until
``logical_decoding_work_mem`` fills, sends that block, and only then decodes
the next one, so a worker that reads the block no faster than the target
applies it leaves the target idle while the next block is decoded (measured on
1,000,000 streamed UPDATEs, 18->18: the target backend idle ~0.5 s mid-way,
the walsender alone at 100%). PostgreSQL's parallel apply leader avoids it by
spooling what its worker cannot take yet ("partial serialize").

:class:`ReadAhead` takes the CopyData messages libpq can give into memory
(undecoded, as libpq returns them), up to :data:`READ_AHEAD_BYTES`, whenever
the apply pipeline waits on the target (:class:`~applier.apply.pipeline.Pipeline`
calls :meth:`ReadAhead.fill` when the replication socket is readable during
its wait, at most every :data:`FILL_EVERY` seconds). The stream's reader takes
them back first, in order, through :meth:`ReadAhead.get`, which stands in for
``PGconn.get_copy_data``. Nothing is decoded or acknowledged ahead: positions,
keepalive replies and errors are handled when the reader takes the messages, as
before.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from typing import Any

import psycopg

#: Bytes of CopyData held ahead at most: a quarter of a default
#: logical_decoding_work_mem block, so the walsender decodes the next block
#: that much sooner. They are kept packed (one bytearray per fill, the
#: messages' lengths in an array): libpq's buffer and psycopg's memoryview of
#: each message cost ~300 bytes more per message than its bytes (measured:
#: 16 MB of 150-byte messages held so took ~110 MB of RSS).
READ_AHEAD_BYTES = 8 * 1024 * 1024
#: Seconds between two fills: each takes what the socket gathered meanwhile (a few
#: MB at most, which the kernel's buffers hold) in one go. Filling at every
#: readable moment took a few messages per wake-up and doubled the worker's CPU
#: on a backlog of small transactions (200,000 rows in 200 transactions: applier
#: 0.37 -> 0.70 CPU s, the walsender 0.77 -> 0.93).
FILL_EVERY = 0.02


class ReadAhead:
    """CopyData taken from libpq ahead of the reader (see the module docstring)."""

    __slots__ = (
        "_chunks", "_i", "_lens", "_pgconn", "_pos", "_view", "limit", "nbytes", "next_fill",
        "stopped", "taken",
    )  # fmt: skip

    def __init__(self, pgconn: Any, limit: int = READ_AHEAD_BYTES) -> None:
        self._pgconn = pgconn
        #: time.monotonic() before which no fill starts (FILL_EVERY).
        self.next_fill = 0.0
        #: Each fill's messages: their bytes end to end, and their lengths.
        self._chunks: deque[tuple[bytearray, array[int]]] = deque()
        #: The chunk being read: a view of its bytes, its lengths, the next one's
        #: index and offset.
        self._view: memoryview | None = None
        self._lens: array[int] = array("q")
        self._i = 0
        self._pos = 0
        self.limit = limit
        #: Bytes held (a chunk counts until its last message is taken).
        self.nbytes = 0
        #: Set when libpq failed or the COPY ended: the reader finds out why.
        self.stopped = False
        #: Bytes taken ahead in all (for the worker's log).
        self.taken = 0

    def __bool__(self) -> bool:
        return self._view is not None or bool(self._chunks)

    @property
    def room(self) -> bool:
        """Whether :meth:`fill` would take more."""
        return not self.stopped and self.nbytes < self.limit

    def fill(self) -> bool:
        """Take what libpq has received, up to the limit; whether there is room left.

        Never raises: a broken connection is left for the reader to report.
        """
        self.next_fill = time.monotonic() + FILL_EVERY
        pg = self._pgconn
        buf = bytearray()
        lens: array[int] = array("q")
        room = self.limit - self.nbytes
        try:
            pg.consume_input()
            while len(buf) < room:
                n, data = pg.get_copy_data(1)
                if n == 0:
                    break
                lens.append(n)
                if n < 0:  # the COPY ended: the reader sees it in order
                    self.stopped = True
                    break
                buf += data
        except psycopg.OperationalError:
            self.stopped = True
        if lens:
            self._chunks.append((buf, lens))  # not copied to bytes: no second peak
            self.nbytes += len(buf)
            self.taken += len(buf)
        return self.room

    def get(self, async_: int) -> tuple[int, Any]:
        """``PGconn.get_copy_data``, serving what was taken ahead first."""
        view = self._view
        if view is None:
            if not self._chunks:
                return self._pgconn.get_copy_data(async_)  # type: ignore[no-any-return]
            chunk, self._lens = self._chunks.popleft()
            view = self._view = memoryview(chunk)
            self._i = self._pos = 0
        n = self._lens[self._i]
        self._i += 1
        if self._i == len(self._lens):  # its last message: the chunk goes with it
            self._view = None
            self.nbytes -= len(view)
        if n < 0:
            return n, b""
        start = self._pos
        self._pos = start + n
        return n, view[start : start + n]
