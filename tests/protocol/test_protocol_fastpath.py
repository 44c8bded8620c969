"""The fused receive+decode fast path of LogicalStream.read, against the plain decoder.

``LogicalStream.read`` decodes inside its CopyData loop (payload copied once,
the GC paused per batch) instead of decoding what ``read_raw`` returns. These
tests drive both over a fake libpq connection (no server) with every message
the Hypothesis strategies produce and check they agree with
``PgOutputDecoder.decode`` message by message, stream state included, and
that errors and the collector's state come out as before.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
from hypothesis import given, settings
from protocol_helpers import fake_stream
from protocol_strategies import Case, any_case

from applier.errors import DecodeError
from applier.lsn import Lsn
from applier.protocol import (
    Insert,
    StreamStart,
    StreamStop,
    TupleData,
    encode,
    keepalive,
    xlogdata,
)

SETTINGS = settings(max_examples=300, deadline=None)


def _frames(case: Case) -> tuple[list[bytes], list[tuple[Lsn, Any]], list[bytes]]:
    """CopyData frames for a case (Stream Start first if in a stream), expected items, payloads."""
    msg, proto, in_stream = case
    msgs: list[tuple[Any, bool]] = [(msg, in_stream)]
    if in_stream:
        msgs.insert(0, (StreamStart(7, True), False))
    frames, items, payloads = [], [], []
    for i, (m, inside) in enumerate(msgs):
        payload = encode(m, proto, inside)
        lsn = Lsn(0x1000 + 100 * i)
        frames.append(xlogdata(lsn, lsn + 50, 123, payload))
        frames.append(keepalive(lsn + 60, 124))
        items.append((lsn, m))
        payloads.append(payload)
    return frames, items, payloads


@SETTINGS
@given(any_case)
def test_read_decodes_like_the_decoder(case: Case) -> None:
    frames, items, _ = _frames(case)
    stream, _ = fake_stream(case[1], frames)
    got = stream.read(0)
    assert got == items
    assert [type(m) for _, m in got] == [type(m) for _, m in items]
    msg, _, in_stream = case
    expected = isinstance(msg, StreamStart) or (in_stream and not isinstance(msg, StreamStop))
    assert stream.decoder.in_stream == expected
    assert stream.last_received == items[-1][0] + 60
    assert stream.messages_received == len(frames)
    assert stream.keepalives_received == len(items)


@SETTINGS
@given(any_case)
def test_read_raw_returns_the_payloads(case: Case) -> None:
    frames, items, payloads = _frames(case)
    stream, _ = fake_stream(case[1], frames)
    got = stream.read_raw(0)
    assert [lsn for lsn, _ in got] == [lsn for lsn, _ in items]
    assert [bytes(p) for _, p in got] == payloads


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_paused_while_draining_and_restored(enabled: bool) -> None:
    row = Insert(None, 1, TupleData.text(b"1", None))
    frames = [xlogdata(i, i, 0, encode(row)) for i in range(1, 50)]
    was = gc.isenabled()
    try:
        if not enabled:
            gc.disable()
        stream, pg = fake_stream(1, frames)
        assert len(stream.read(0)) == 49
        assert pg.gc_seen == {False}
        assert gc.isenabled() == enabled
    finally:
        if was:
            gc.enable()


def test_decode_error_keeps_offset_and_gains_the_lsn() -> None:
    good = encode(Insert(None, 1, TupleData.text(b"1")))
    bad = good[:-1]  # truncated value
    frames = [xlogdata(10, 10, 0, good), xlogdata(20, 20, 0, bad)]
    stream, _ = fake_stream(1, frames)
    was = gc.isenabled()
    with pytest.raises(DecodeError) as info:
        stream.read(0)
    assert info.value.msg_type == "I"
    assert info.value.context["lsn"] == 20
    assert gc.isenabled() == was
    # Not advanced past the message that could not be decoded.
    assert stream.last_received == 10


def test_truncated_xlogdata_header_is_a_decode_error() -> None:
    stream, _ = fake_stream(1, [b"w" + b"\0" * 10])
    with pytest.raises(DecodeError) as info:
        stream.read(0)
    assert info.value.msg_type == "w"
    assert info.value.offset == 9


def test_xlogdata_without_payload_is_a_decode_error() -> None:
    stream, _ = fake_stream(1, [xlogdata(5, 5, 0, b"")])
    with pytest.raises(DecodeError) as info:
        stream.read(0)
    assert info.value.offset == 0
    assert info.value.context["lsn"] == 5
