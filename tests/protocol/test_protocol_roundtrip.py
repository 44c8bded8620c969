"""Property tests: encode -> decode is the identity, and decode -> encode gives the bytes back."""

from __future__ import annotations

from hypothesis import given, settings
from protocol_helpers import decoder_for
from protocol_strategies import Case, any_case

from applier.protocol import StreamStart, StreamStop, encode

SETTINGS = settings(max_examples=400, deadline=None)


@SETTINGS
@given(any_case)
def test_encode_then_decode_is_identity(case: Case) -> None:
    msg, proto, in_stream = case
    dec = decoder_for(proto, in_stream)
    assert dec.decode(encode(msg, proto, in_stream)) == msg


@SETTINGS
@given(any_case)
def test_decode_then_encode_gives_the_bytes(case: Case) -> None:
    msg, proto, in_stream = case
    data = encode(msg, proto, in_stream)
    dec = decoder_for(proto, in_stream)
    assert encode(dec.decode(data), proto, in_stream) == data
    # Memoryview and bytearray input decode the same.
    assert decoder_for(proto, in_stream).decode(memoryview(data)) == msg
    assert decoder_for(proto, in_stream).decode(bytearray(data)) == msg


@SETTINGS
@given(any_case)
def test_stream_state_follows_start_and_stop(case: Case) -> None:
    msg, proto, in_stream = case
    dec = decoder_for(proto, in_stream)
    dec.decode(encode(msg, proto, in_stream))
    expected = isinstance(msg, StreamStart) or (in_stream and not isinstance(msg, StreamStop))
    assert dec.in_stream == expected
