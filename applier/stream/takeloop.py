"""The stream's read loop: the CopyData buffered, taken into a batch, decoded.

:meth:`TakeLoop._take_buffered` serves what the read-ahead holds first
(:mod:`applier.stream.readahead`), fill by fill, then what libpq has buffered,
until the batch is full. Each source is taken by ``take_xlog`` (C, when the
speedups are built: a fill is read in place, libpq through ``get()``) or by
:meth:`TakeLoop._take_py`, its Python twin, which also takes undecoded reads;
both hand a message that is not an XLogData back to be handled here
(:meth:`TakeLoop._keepalive`) or named. Positions are recorded per source
(:meth:`TakeLoop._took`); nothing is waited for. A mixin of
:class:`~applier.stream.client.LogicalStream`, which owns the connection.
"""

from __future__ import annotations

import time
from struct import error as StructError
from typing import TYPE_CHECKING, Any

from applier.errors import ApplierError, DecodeError, ProtocolError
from applier.lsn import Lsn
from applier.protocol import Keepalive, PgOutputDecoder, parse_copydata
from applier.protocol.copydata import XLOG_HEADER, XLOG_PAYLOAD_AT, XLOG_TAG
from applier.speedups import take_xlog as _take_xlog
from applier.stream.readahead import ReadAhead, chunk_get


class TakeLoop:
    """Mixin of :class:`~applier.stream.client.LogicalStream`: taking a batch."""

    ahead: ReadAhead
    #: libpq's next CopyData without waiting (``get_copy_data`` with async=1).
    _get: Any
    _group: Any
    last_received: Lsn
    last_send_time: int
    keepalives_received: int
    messages_received: int
    bytes_received: int
    _last_heard: float
    _ping_at: float

    if TYPE_CHECKING:  # provided by LogicalStream

        def _copy_ended(self) -> ApplierError: ...
        def _send_status_locked(self, reply_requested: bool) -> None: ...

    def _take_buffered(self, out: list[Any], decoder: PgOutputDecoder | None, limit: int) -> int:
        """Move the complete CopyData messages buffered into ``out``, decoded: what
        was read ahead first (applier.stream.readahead), fill by fill, then what
        libpq holds, until ``out`` holds ``limit`` items. Returns how many were taken.
        """
        take = self._take_c if _take_xlog is not None and decoder is not None else self._take_py
        ahead = self.ahead
        count = 0
        while ahead:
            n = take(ahead.getter(), out, decoder, limit)
            count += n
            if not ahead.took(n):  # the batch is full before the fill's end
                return count
        return count + take(self._get, out, decoder, limit)

    def _take_c(self, get: Any, out: list[Any], decoder: PgOutputDecoder | None, limit: int) -> int:
        """The loop of :meth:`_take_py` in C (``take_xlog``) on what ``get()`` gives;
        a message that is not an XLogData comes back here, to be handled or named as
        the Python loop does."""
        take = _take_xlog
        assert take is not None and decoder is not None
        table, decode = decoder.handlers, decoder.decode
        state: list[Any] = [0, 0, self.last_received, None, None, self.last_send_time]
        try:
            while True:
                status = take(get, table, decode, out, limit - len(out), Lsn, state, self._group)
                if status == 0:
                    break
                if status == 1:
                    raise self._copy_ended()
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
            self.last_send_time = sent
            self.last_received = Lsn(last)
            self._last_heard = time.monotonic()
            self._ping_at = 0.0
            self.messages_received += count
            self.bytes_received += nbytes

    def _take_py(
        self, get: Any, out: list[Any], decoder: PgOutputDecoder | None, limit: int
    ) -> int:
        """Take what ``get()`` gives into ``out`` (also for undecoded reads); how many.
        ``get`` may be a read-ahead cursor instead (moved by what was taken, as in C).

        The hot loop of the stream, written for speed: one header unpack per
        XLogData, the payload copied out of libpq's buffer once, the decoder's
        handler called straight from its dispatch table (what decode() does,
        minus a call and a type check; Stream Start/Stop rewrite the table in
        place, so it is bound once and indexed per message).
        """
        cursor = get if type(get) is list else None
        if cursor is not None:
            get = chunk_get(cursor)
        unpack = XLOG_HEADER.unpack_from
        table = [] if decoder is None else decoder.handlers
        append = out.append
        room = limit - len(out)
        count = nbytes = 0
        last: int = self.last_received
        sent = self.last_send_time
        try:
            while room > 0:
                n, data = get()
                if n <= 0:
                    if n == -1:
                        raise self._copy_ended()
                    break
                count += 1
                nbytes += n
                if data[0] == XLOG_TAG:
                    start, end, sent = unpack(data, 1)
                    lsn = Lsn(start)
                    if decoder is None:
                        append((lsn, data[XLOG_PAYLOAD_AT:]))
                    else:
                        # tobytes() then a bytes slice: half the cost of bytes(view[25:])
                        payload = data.tobytes()[XLOG_PAYLOAD_AT:]
                        try:
                            try:
                                handler = table[payload[0]]
                            except IndexError:  # no pgoutput message in the XLogData
                                handler = decoder.decode  # raises DecodeError("empty message")
                            append((lsn, handler(payload)))
                        except DecodeError as e:
                            e.context.setdefault("lsn", lsn)
                            raise
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
        self.keepalives_received += 1
        if ka.wal_end > last:
            last = ka.wal_end
        if ka.reply_requested:
            self.last_received = Lsn(last)
            self._send_status_locked(reply_requested=False)
        return last
