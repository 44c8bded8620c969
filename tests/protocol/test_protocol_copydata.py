"""CopyData framing: XLogData, primary keepalive, standby status update."""

from __future__ import annotations

import struct

import pytest

from applier.errors import DecodeError
from applier.lsn import Lsn
from applier.protocol import (
    Keepalive,
    XLogData,
    keepalive,
    parse_copydata,
    standby_status_update,
    xlogdata,
)

h = bytes.fromhex


def test_xlogdata_hand_written() -> None:
    data = b"w" + h("0000000100000000") + h("0000000100000010") + h("0000000000000005") + b"B..."
    msg = parse_copydata(data)
    assert msg == XLogData(Lsn(1 << 32), Lsn((1 << 32) + 16), 5, b"B...")
    assert isinstance(msg, XLogData) and type(msg.payload) is bytes


def test_xlogdata_from_memoryview_is_zero_copy() -> None:
    buf = bytearray(xlogdata(1, 2, 3, b"payload"))
    msg = parse_copydata(memoryview(buf))
    assert isinstance(msg, XLogData) and isinstance(msg.payload, memoryview)
    assert bytes(msg.payload) == b"payload"


def test_keepalive_hand_written() -> None:
    msg = parse_copydata(b"k" + h("00000000016b3748") + h("fffffffffffffffe") + h("01"))
    assert msg == Keepalive(Lsn(0x16B3748), -2, True)
    assert parse_copydata(keepalive(7, 8, False)) == Keepalive(Lsn(7), 8, False)


def test_standby_status_update_layout() -> None:
    data = standby_status_update(Lsn(1), Lsn(2), Lsn(3), 4, reply_requested=True)
    assert data == b"r" + struct.pack(">QQQq", 1, 2, 3, 4) + b"\x01"
    assert len(data) == 34


@pytest.mark.parametrize(
    ("data", "msg_type", "offset"),
    [
        (b"", None, 0),
        (b"x", "x", 0),
        (b"w" + h("00000000"), "w", 1),
        (b"w" + bytes(8) + bytes(3), "w", 9),
        (b"w" + bytes(16), "w", 17),
        (b"k" + bytes(18), "k", 18),
        (b"k" + bytes(16), "k", 17),
        (b"k" + bytes(10), "k", 9),
        (b"k" + bytes(16) + b"\x02", "k", 17),
    ],
)
def test_bad_copydata(data: bytes, msg_type: str | None, offset: int) -> None:
    with pytest.raises(DecodeError) as info:
        parse_copydata(data)
    assert (info.value.msg_type, info.value.offset) == (msg_type, offset)
