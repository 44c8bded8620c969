"""defer_streamed: in-stream changes stay bytes, and decode later to the same message."""

from __future__ import annotations

import pytest

from applier.errors import DecodeError
from applier.lsn import Lsn
from applier.protocol import (
    Column,
    Delete,
    Insert,
    Message,
    PgOutputDecoder,
    Relation,
    StreamedChange,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
    decode_streamed,
    encode,
)

IN_STREAM = [
    Relation(7, 1, "s", "t", "d", (Column(1, "id", 23, -1),)),
    Type(7, 99, "s", "mood"),
    Insert(7, 1, TupleData.text(b"1")),
    Update(7, 1, None, None, TupleData.text(b"2")),
    Delete(8, 1, TupleData.text(b"2"), "K"),
    Truncate(7, 0, (1,)),
    # A logical message too: a captured DDL statement is spooled in its place.
    Message(7, True, Lsn(0x16B3748), "applier.ddl", b"{}"),
]


def test_deferred_changes_decode_to_the_same_messages() -> None:
    plain = PgOutputDecoder(2)
    lazy = PgOutputDecoder(2, defer_streamed=True)
    for dec in (plain, lazy):
        dec.decode(encode(StreamStart(7, True), 2))
    for msg in IN_STREAM:
        data = encode(msg, 2, in_stream=True)
        deferred = lazy.decode(data)
        assert isinstance(deferred, StreamedChange)
        assert deferred.data == data and deferred.xid == msg.xid
        assert decode_streamed(deferred.data) == plain.decode(data) == msg
    lazy.decode(encode(StreamStop(), 2))
    # Outside a stream block nothing is deferred.
    assert lazy.decode(encode(Insert(None, 1, TupleData.text(b"1")), 2)) == Insert(
        None, 1, TupleData.text(b"1")
    )


def test_deferred_bad_bytes_fail_at_receive_or_replay() -> None:
    lazy = PgOutputDecoder(2, defer_streamed=True)
    lazy.decode(encode(StreamStart(7, True), 2))
    with pytest.raises(DecodeError):
        lazy.decode(b"I\x00\x00")  # no room for the xid
    broken = lazy.decode(b"I\x00\x00\x00\x07\x00\x00\x00\x01N\x00")
    assert isinstance(broken, StreamedChange)
    with pytest.raises(DecodeError):
        decode_streamed(broken.data)
    with pytest.raises(DecodeError):
        decode_streamed(encode(StreamStop(), 2))
