"""Fuzzing: whatever bytes arrive, the decoder returns a message or raises DecodeError.

Nothing else may escape (IndexError, struct.error, UnicodeDecodeError, ...).
And whatever it accepts must re-encode to exactly the input: a decoder that
accepts bytes it cannot reproduce has misparsed them. Raise the budget with
``PROTOCOL_FUZZ_EXAMPLES=20000``.
"""

from __future__ import annotations

import contextlib
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_helpers import decoder_for
from protocol_strategies import Case, any_case

from applier.errors import DecodeError
from applier.protocol import encode, parse_copydata

EXAMPLES = int(os.environ.get("PROTOCOL_FUZZ_EXAMPLES", "500"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TAGS = b"BCORYIUDTMSEcAbPKrpZ"


def check(data: bytes, proto: int, in_stream: bool, streaming_parallel: bool | None = None) -> None:
    dec = decoder_for(proto, in_stream)
    dec.streaming_parallel = streaming_parallel
    try:
        msg = dec.decode(data)
    except DecodeError as exc:
        assert exc.offset is not None and 0 <= exc.offset <= len(data)
        assert dec.in_stream == in_stream
        return
    assert encode(msg, proto, in_stream) == data


@FUZZ
@given(st.binary(max_size=64), st.integers(1, 4), st.booleans())
def test_random_bytes(data: bytes, proto: int, in_stream: bool) -> None:
    check(data, proto, in_stream and proto >= 2)


@FUZZ
@given(st.sampled_from(TAGS), st.binary(max_size=64), st.integers(1, 4), st.booleans())
def test_random_body_after_a_real_tag(tag: int, body: bytes, proto: int, in_stream: bool) -> None:
    check(bytes((tag,)) + body, proto, in_stream and proto >= 2)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[bytes, int, bool]:
    msg, proto, in_stream = draw(any_case)
    data = bytearray(encode(msg, proto, in_stream))
    how = draw(st.sampled_from(["truncate", "flip", "extend", "insert", "delete", "set"]))
    if how == "truncate":
        del data[draw(st.integers(0, len(data))) :]
    elif how == "flip":
        i = draw(st.integers(0, len(data) - 1))
        data[i] ^= 1 << draw(st.integers(0, 7))
    elif how == "extend":
        data += draw(st.binary(min_size=1, max_size=8))
    elif how == "insert":
        i = draw(st.integers(0, len(data)))
        data[i:i] = draw(st.binary(min_size=1, max_size=4))
    elif how == "delete":
        i = draw(st.integers(0, len(data) - 1))
        del data[i : i + draw(st.integers(1, 4))]
    else:
        data[draw(st.integers(0, len(data) - 1))] = draw(st.sampled_from((0, 0xFF, 0x80, 0x74)))
    return bytes(data), proto, in_stream


@FUZZ
@given(mutated())
def test_mutated_valid_messages(case: tuple[bytes, int, bool]) -> None:
    check(*case)


@FUZZ
@given(mutated(), st.sampled_from((None, False, True)))
def test_mutated_with_explicit_parallel_streaming(
    case: tuple[bytes, int, bool], par: bool | None
) -> None:
    data, proto, in_stream = case
    check(data, proto, in_stream, par if proto >= 4 else None)


@FUZZ
@given(any_case, st.integers(0, 40))
def test_every_truncation_is_an_error(case: Case, cut: int) -> None:
    msg, proto, in_stream = case
    data = encode(msg, proto, in_stream)
    if cut < len(data):
        # Only Stream Abort has a valid shorter form (without the v4 fields).
        try:
            decoder_for(proto, in_stream).decode(data[:cut])
        except DecodeError:
            return
        assert msg.tag == "A" and cut == 9


@FUZZ
@given(st.binary(max_size=48))
def test_copydata_random_bytes(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        parse_copydata(data)
