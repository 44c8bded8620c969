"""Shared helpers for the protocol tests."""

from __future__ import annotations

from applier.protocol import PgOutputDecoder, PgOutputMessage, StreamStart, encode


def decoder_for(proto: int, in_stream: bool) -> PgOutputDecoder:
    """A decoder at ``proto``, inside a stream block if ``in_stream``."""
    dec = PgOutputDecoder(proto)
    if in_stream:
        dec.decode(encode(StreamStart(1, True), proto))
    return dec


def decode_in(data: bytes, proto: int = 1, in_stream: bool = False) -> PgOutputMessage:
    return decoder_for(proto, in_stream).decode(data)
