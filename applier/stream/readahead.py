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
the apply pipeline waits on the target (:class:`~applier.apply.target.pipeline.Pipeline`
calls :meth:`ReadAhead.fill` when the replication socket is readable during
its wait, at most every :data:`FILL_EVERY` seconds). The stream's reader takes
them back first, in order: :meth:`ReadAhead.getter` gives the first fill not
read to its end as a cursor over its bytes, which the read loop reads in place
(``take_xlog``), so that a message costs the loop no more taken ahead than
from libpq. A fill reads libpq with ``fill_copy`` (:mod:`applier.speedups`:
C when built, else its Python twin). Nothing is decoded or
acknowledged ahead: positions, keepalive replies and errors are handled when
the reader takes the messages, as before.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable
from functools import partial
from itertools import accumulate, chain
from typing import Any

import psycopg

from applier.speedups import fill_copy

#: Bytes of CopyData held ahead at most: a quarter of a default
#: logical_decoding_work_mem block, so the walsender decodes the next block
#: that much sooner. They are kept packed (one bytearray per fill, the
#: messages' lengths in an array): libpq's buffer and psycopg's memoryview of
#: each message cost ~300 bytes more per message than its bytes (measured:
#: 16 MB of 150-byte messages held so took ~110 MB of RSS).
READ_AHEAD_BYTES = 8 * 1024 * 1024
#: Seconds between two fills: each takes what the socket gathered meanwhile (a few
#: MB at most, which the kernel's buffers hold) in one go. (Until a fill read
#: libpq again until it gave no message, each took one libpq buffer, ~16 kB:
#: 2 MB of the 90 MB of 1,000,000 streamed UPDATEs, and the walsender still
#: waited on a full socket half its time.) Filling at every
#: readable moment took a few messages per wake-up and doubled the worker's CPU
#: on a backlog of small transactions (200,000 rows in 200 transactions: applier
#: 0.37 -> 0.70 CPU s, the walsender 0.77 -> 0.93).
FILL_EVERY = 0.02


#: What a getter returns when its fill is all read: libpq's "nothing buffered".
NOTHING = (0, b"")
#: The getter of the COPY's end, once every fill before it is read.
_ENDED = (-1, b"")

Get = Callable[[], tuple[int, Any]]


class ReadAhead:
    """CopyData taken from libpq ahead of the reader (see the module docstring)."""

    __slots__ = (
        "_chunks", "_consume", "_cursor", "_ended", "_get", "_left", "_size",
        "limit", "nbytes", "next_fill", "stopped", "taken",
    )  # fmt: skip

    def __init__(self, pgconn: Any, limit: int = READ_AHEAD_BYTES) -> None:
        #: What ``fill_copy`` calls: libpq's read, and its next CopyData without waiting.
        self._consume = pgconn.consume_input
        self._get = partial(pgconn.get_copy_data, 1)
        #: time.monotonic() before which no fill starts (FILL_EVERY).
        self.next_fill = 0.0
        #: Each fill's messages: their bytes end to end, and their lengths.
        self._chunks: deque[tuple[bytearray, array[int]]] = deque()
        #: The fill being read: its cursor, its messages not read yet, its bytes.
        self._cursor: list[Any] | None = None
        self._left = 0
        self._size = 0
        #: The COPY ended after the fills held (the reader gets -1 after them).
        self._ended = False
        self.limit = limit
        #: Bytes held (a fill counts until its last message is read).
        self.nbytes = 0
        #: Set when libpq failed or the COPY ended: the reader finds out why.
        self.stopped = False
        #: Bytes taken ahead in all (for the worker's log).
        self.taken = 0

    def __bool__(self) -> bool:
        return self._cursor is not None or bool(self._chunks) or self._ended

    @property
    def room(self) -> bool:
        """Whether :meth:`fill` would take more."""
        return not self.stopped and self.nbytes < self.limit

    def fill(self) -> bool:
        """Take what the socket holds, up to the limit; whether there is room left.

        Never raises: a broken connection is left for the reader to report.
        """
        self.next_fill = time.monotonic() + FILL_EVERY
        buf = bytearray()
        lens: array[int] = array("q")
        room = self.limit - self.nbytes
        try:
            packed = bytearray()  # the lengths, 8 bytes each
            try:
                ended = fill_copy(self._consume, self._get, buf, packed, room) == 1
            finally:  # what was taken before an error is the reader's too
                lens.frombytes(packed)
            if ended:  # the COPY ended: the reader sees it after what came before
                self.stopped = self._ended = True
        except psycopg.OperationalError:
            self.stopped = True
        if lens:
            self._chunks.append((buf, lens))  # not copied to bytes: no second peak
            self.nbytes += len(buf)
            self.taken += len(buf)
        return self.room

    def getter(self) -> Get | list[Any]:
        """What the reader takes next: the first fill not read to its end, as the
        cursor ``[data, lens, i, pos]`` that the read loop reads in place and moves
        (``take_xlog``; :func:`chunk_get` for the Python loop), or once every fill is
        read, a ``get()`` of the COPY's end. Tell :meth:`took` how many it gave.

        Call only while the read-ahead holds something (``bool(self)``).
        """
        if self._cursor is None:
            if not self._chunks:
                assert self._ended, "getter() of an empty read-ahead"
                self._ended = False
                return partial(next, iter((_ENDED,)), NOTHING)
            buf, lens = self._chunks.popleft()
            self._cursor = [buf, lens, 0, 0]
            self._left, self._size = len(lens), len(buf)
        return self._cursor

    def took(self, count: int) -> bool:
        """The reader took ``count`` messages from :meth:`getter`'s get; whether that
        fill is all read (its bytes are then no longer counted)."""
        self._left -= count
        if self._left > 0:
            return False
        self._cursor = None
        self.nbytes -= self._size
        return True


def chunk_get(cursor: list[Any]) -> Get:
    """A ``get()`` of the messages of a :meth:`ReadAhead.getter` cursor from where it
    stands (then ``NOTHING``). The caller moves the cursor by what it took."""
    buf, lens, i, pos = cursor
    view = memoryview(buf)[pos:]
    rest = lens[i:]
    ends = list(accumulate(rest))
    slices = map(view.__getitem__, map(slice, chain((0,), ends), ends))
    return partial(next, zip(rest, slices, strict=True), NOTHING)
