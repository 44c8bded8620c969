"""The stream's read loop: the CopyData buffered, taken into a batch, decoded.

:meth:`TakeLoop.take_buffered` serves what the read-ahead holds first
(:mod:`applier.stream.readahead`), fill by fill, then what libpq has buffered,
until the batch is full. Each source is taken by ``take_xlog`` (from
:mod:`applier.speedups`: C when built, else its Python twin; a fill is read in
place, libpq through ``get()``), which hands a message that is not an XLogData
back to be handled here (:meth:`TakeLoop._keepalive`) or named; undecoded
reads (``read_raw``) go through :meth:`TakeLoop._take_raw`. Positions are
recorded per source (:meth:`TakeLoop._took`); nothing is waited for.

A part of :class:`~applier.stream.client.LogicalStream`, which owns the
connection and creates it; what it needs of the stream is :class:`TakeHost`.
"""

from __future__ import annotations

from struct import error as StructError
from typing import Any, Protocol

from applier.errors import ApplierError, DecodeError, ProtocolError
from applier.lsn import Lsn
from applier.protocol import Keepalive, PgOutputDecoder, parse_copydata
from applier.protocol.copydata import XLOG_HEADER, XLOG_PAYLOAD_AT, XLOG_TAG
from applier.speedups import take_xlog
from applier.stream.readahead import Get, ReadAhead, chunk_get


class TakeHost(Protocol):
    """What the take loop reads and records on its stream."""

    #: The highest wal_end seen (XLogData or keepalive).
    last_received: Lsn
    #: The send_time of the last XLogData taken (the server's clock).
    last_send_time: int
    messages_received: int
    bytes_received: int
    keepalives_received: int

    def heard(self) -> None:
        """The walsender was heard from just now (no reply is owed any more)."""

    def copy_ended(self) -> ApplierError:
        """The error to raise now that the walsender ended the COPY."""

    def send_status_locked(self, reply_requested: bool) -> None:
        """Send a standby status update (libpq's lock held)."""


class TakeLoop:
    """Takes a batch of CopyData for its :class:`TakeHost` (see the module docstring)."""

    __slots__ = ("_ahead", "_get", "_group", "_host")

    def __init__(
        self, host: TakeHost, get: Get, ahead: ReadAhead, group: tuple[Any, ...] | None
    ) -> None:
        self._host = host
        #: libpq's next CopyData without waiting (``get_copy_data`` with async=1).
        self._get = get
        self._ahead = ahead
        #: What take_xlog makes runs of streamed changes and of Inserts into, or None.
        self._group = group

    def take_buffered(self, out: list[Any], decoder: PgOutputDecoder | None, limit: int) -> int:
        """Move the complete CopyData messages buffered into ``out``, decoded: what
        was read ahead first (applier.stream.readahead), fill by fill, then what
        libpq holds, until ``out`` holds ``limit`` items. Returns how many were taken.
        """
        take = self._take_raw if decoder is None else self._take
        ahead = self._ahead
        count = 0
        while ahead:
            n = take(ahead.getter(), out, decoder, limit)
            count += n
            if not ahead.took(n):  # the batch is full before the fill's end
                return count
        return count + take(self._get, out, decoder, limit)

    def _take(self, get: Any, out: list[Any], decoder: PgOutputDecoder | None, limit: int) -> int:
        """``take_xlog`` on what ``get()`` gives; a message that is not an XLogData
        comes back here, to be handled or named."""
        assert decoder is not None
        host = self._host
        table, decode = decoder.handlers, decoder.decode
        state: list[Any] = [0, 0, host.last_received, None, None, host.last_send_time]
        try:
            while True:
                status = take_xlog(
                    get, table, decode, out, limit - len(out), Lsn, state, self._group
                )
                if status == 0:
                    break
                if status == 1:
                    raise host.copy_ended()
                data, state[4] = state[4], None
                if data[0] == XLOG_TAG:
                    parse_copydata(data)  # a truncated 'w' header: raises the precise DecodeError
                state[2] = self._keepalive(data, state[2])
        except DecodeError as e:
            if state[3] is not None:
                e.context.setdefault("lsn", Lsn(state[3]))
            raise
        finally:
            self._took(state[0], state[1], state[2], state[5])
        return int(state[0])

    def _took(self, count: int, nbytes: int, last: int, sent: int) -> None:
        if count:
            host = self._host
            host.last_send_time = sent
            host.last_received = Lsn(last)
            host.heard()
            host.messages_received += count
            host.bytes_received += nbytes

    def _take_raw(
        self, get: Any, out: list[Any], decoder: PgOutputDecoder | None, limit: int
    ) -> int:
        """Take what ``get()`` gives into ``out``, undecoded: ``(lsn, payload)``; how
        many. ``get`` may be a read-ahead cursor instead (moved by what was taken)."""
        cursor = get if type(get) is list else None
        if cursor is not None:
            get = chunk_get(cursor)
        unpack = XLOG_HEADER.unpack_from
        append = out.append
        room = limit - len(out)
        count = nbytes = 0
        last: int = self._host.last_received
        sent = self._host.last_send_time
        try:
            while room > 0:
                n, data = get()
                if n <= 0:
                    if n == -1:
                        raise self._host.copy_ended()
                    break
                count += 1
                nbytes += n
                if data[0] == XLOG_TAG:
                    start, end, sent = unpack(data, 1)
                    append((Lsn(start), data[XLOG_PAYLOAD_AT:]))
                    room -= 1
                    if end > last:
                        last = end
                else:
                    last = self._keepalive(data, last)
        except StructError:
            parse_copydata(data)  # a truncated 'w' header: raises the precise DecodeError
            raise
        finally:
            if cursor is not None:
                cursor[2] += count
                cursor[3] += nbytes
            self._took(count, nbytes, last, sent)
        return count

    def _keepalive(self, data: memoryview, last: int) -> int:
        ka = parse_copydata(data)  # not 'w': a keepalive, or DecodeError naming the tag
        if not isinstance(ka, Keepalive):
            raise ProtocolError("unexpected CopyData message from the walsender")
        host = self._host
        host.keepalives_received += 1
        if ka.wal_end > last:
            last = ka.wal_end
        if ka.reply_requested:
            host.last_received = Lsn(last)
            host.send_status_locked(reply_requested=False)
        return last
