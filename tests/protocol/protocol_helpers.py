"""Shared helpers for the protocol tests."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

from applier.protocol import PgOutputDecoder, PgOutputMessage, StreamStart, encode
from applier.stream.client import LogicalStream, StreamOptions


def decoder_for(proto: int, in_stream: bool) -> PgOutputDecoder:
    """A decoder at ``proto``, inside a stream block if ``in_stream``."""
    dec = PgOutputDecoder(proto)
    if in_stream:
        dec.decode(encode(StreamStart(1, True), proto))
    return dec


def decode_in(data: bytes, proto: int = 1, in_stream: bool = False) -> PgOutputMessage:
    return decoder_for(proto, in_stream).decode(data)


_SERVER = {1: 130000, 2: 140000, 3: 150000, 4: 160000}


class FakePgConn:
    """What LogicalStream._drain uses of psycopg's PGconn: everything is buffered at once."""

    def __init__(self, copydata: list[bytes]) -> None:
        self._items: Iterator[bytes] = iter(copydata)
        self.gc_seen: set[bool] = set()

    def consume_input(self) -> None:
        pass

    def get_copy_data(self, async_: int) -> tuple[int, memoryview | bytes]:
        self.gc_seen.add(gc.isenabled())
        data = next(self._items, None)
        if data is None:
            return 0, b""
        return len(data), memoryview(data)

    def feed(self, copydata: list[bytes]) -> None:
        """More CopyData for the next reads (what the server sent meanwhile)."""
        self._items = iter([*self._items, *copydata])


class _FakeConn:
    def __init__(self, proto: int, pgconn: FakePgConn) -> None:
        self.server_version = _SERVER[proto]
        self.conn: Any = type("Conn", (), {"pgconn": pgconn})()


def fake_stream(
    proto: int, copydata: list[bytes], **options: Any
) -> tuple[LogicalStream, FakePgConn]:
    """A started LogicalStream reading ``copydata`` (no server); ``options`` go to
    StreamOptions."""
    pg = FakePgConn(copydata)
    opts = StreamOptions(
        slot="s",
        publications=["p"],
        proto_version=proto,
        report_flush=False,
        timeout=1e6,
        **options,
    )
    stream = LogicalStream(_FakeConn(proto, pg), opts)  # type: ignore[arg-type]
    # The strategies draw both Stream Abort forms at protocol 4: tell them apart by length.
    stream.decoder = PgOutputDecoder(proto, defer_streamed=opts.defer_streamed)
    stream._started = True
    stream._sel = type("Sel", (), {"select": lambda self, timeout: None})()
    stream._last_heard = stream._last_status = time.monotonic()
    return stream, pg
