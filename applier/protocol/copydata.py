"""Streaming replication CopyData framing around pgoutput messages.

Inside START_REPLICATION's COPY BOTH, each CopyData payload is one of::

    XLogData                  'w' Int64 wal_start, Int64 wal_end, Int64 send_time, Byte[n] payload
    Primary keepalive         'k' Int64 wal_end, Int64 send_time, Byte1 reply_requested (0|1)
    Standby status update     'r' Int64 write, Int64 flush, Int64 apply, Int64 send_time,
                                  Byte1 reply_requested (0|1)          (client -> server)

LSNs are unsigned, times are signed microseconds since 2000-01-01 UTC. The
XLogData payload is the pgoutput message for :class:`PgOutputDecoder`; it is
handed back as a zero-copy ``memoryview`` slice when the input is one.
"""

from __future__ import annotations

from dataclasses import dataclass
from struct import Struct

from applier.errors import DecodeError
from applier.lsn import Lsn

__all__ = [
    "XLOG_HEADER",
    "XLOG_PAYLOAD_AT",
    "XLOG_TAG",
    "Keepalive",
    "XLogData",
    "keepalive",
    "parse_copydata",
    "standby_status_update",
    "xlogdata",
]

#: An XLogData's header after its tag: wal_start, wal_end, send_time. The one
#: definition in Python (the stream's read loop unpacks it in place; the C one
#: is applier/speedups/copydata.h).
XLOG_HEADER = Struct(">QQq")
#: The tag byte of an XLogData, and where its payload starts.
XLOG_TAG = ord("w")
XLOG_PAYLOAD_AT = 1 + XLOG_HEADER.size
_KEEPALIVE_RAW = Struct(">QqB")
_STATUS = Struct(">cQQQqB")


@dataclass(frozen=True, slots=True)
class XLogData:
    wal_start: Lsn
    wal_end: Lsn
    send_time: int
    payload: bytes | memoryview


@dataclass(frozen=True, slots=True)
class Keepalive:
    wal_end: Lsn
    send_time: int
    reply_requested: bool


def _fail(tag: str, offset: int, what: str) -> DecodeError:
    return DecodeError(f"CopyData {tag!r}: {what}", msg_type=tag, offset=offset)


def parse_copydata(data: bytes | bytearray | memoryview) -> XLogData | Keepalive:
    """Parse one CopyData payload from the walsender (``w`` or ``k``)."""
    if not data:
        raise DecodeError("empty CopyData message", offset=0)
    tag = chr(data[0])
    if tag == "w":
        return _parse_xlogdata(data)
    if tag == "k":
        return _parse_keepalive(data)
    shown = tag if 0x20 < data[0] < 0x7F else f"0x{data[0]:02x}"
    raise DecodeError(f"unknown CopyData message type {shown!r}", msg_type=shown, offset=0)


def _parse_xlogdata(data: bytes | bytearray | memoryview) -> XLogData:
    if len(data) < XLOG_PAYLOAD_AT:
        names = ("wal_start", "wal_end", "send_time")
        field = (len(data) - 1) // 8
        raise _fail("w", 1 + 8 * field, f"truncated header: {names[field]} missing")
    start, end, ts = XLOG_HEADER.unpack_from(data, 1)
    view = data if isinstance(data, memoryview) else memoryview(data)
    payload = view[XLOG_PAYLOAD_AT:]
    return XLogData(
        Lsn(start), Lsn(end), ts, payload if isinstance(data, memoryview) else bytes(payload)
    )


def _parse_keepalive(data: bytes | bytearray | memoryview) -> Keepalive:
    size = 1 + _KEEPALIVE_RAW.size
    if len(data) != size:
        if len(data) > size:
            raise _fail("k", size, f"{len(data) - size} trailing bytes")
        names = ("wal_end", "send_time")
        field = min((len(data) - 1) // 8, 2)
        name = names[field] if field < 2 else "reply_requested"
        raise _fail("k", 1 + 8 * field, f"truncated: {name} missing")
    wal_end, ts, reply = _KEEPALIVE_RAW.unpack_from(data, 1)
    if reply > 1:
        raise _fail("k", 17, f"reply_requested must be 0 or 1, got {reply}")
    return Keepalive(Lsn(wal_end), ts, bool(reply))


def standby_status_update(
    write: int, flush: int, apply: int, send_time_us: int, reply_requested: bool = False
) -> bytes:
    """The ``r`` message reporting progress to the walsender."""
    return _STATUS.pack(b"r", write, flush, apply, send_time_us, int(reply_requested))


def xlogdata(wal_start: int, wal_end: int, send_time: int, payload: bytes) -> bytes:
    """Build a ``w`` CopyData payload around a pgoutput message (tests, benchmarks)."""
    return b"w" + XLOG_HEADER.pack(wal_start, wal_end, send_time) + payload


def keepalive(wal_end: int, send_time: int, reply_requested: bool = False) -> bytes:
    """Build a ``k`` CopyData payload (tests, benchmarks)."""
    return b"k" + _KEEPALIVE_RAW.pack(wal_end, send_time, int(reply_requested))
