"""The read-ahead's fill in Python: the twin of ``fill_copy`` in readahead.c.

:func:`fill_copy` moves what libpq can read from the socket into two
bytearrays, for :class:`applier.stream.readahead.ReadAhead`, which uses the
chosen function.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["fill_copy"]


def fill_copy(
    consume: Callable[[], object],
    get: Callable[[], tuple[int, Any]],
    data: bytearray,
    lens: bytearray,
    room: int,
) -> int:
    """Call ``consume()`` (PGconn.consume_input), then ``get()`` (get_copy_data with
    async=1) while it gives a message, each message's bytes appended to ``data`` and
    its length (8 bytes, native order: an array('q') once read back) to ``lens``;
    ``consume()`` again once ``get()`` has nothing (one consume_input reads what fits
    libpq's buffer, not what the socket holds), until a ``consume()`` brings no
    message or ``data`` holds ``room`` bytes. 0 then; 1 when ``get()`` returned -1
    (the COPY ended). An exception of ``consume()`` or ``get()`` propagates, with
    what was taken before it left in ``data`` and ``lens``.
    """
    if not isinstance(data, bytearray) or not isinstance(lens, bytearray):
        raise TypeError("fill_copy(consume, get, data: bytearray, lens: bytearray, room)")
    order = sys.byteorder
    while len(data) < room:
        consume()
        n, got = get()
        if n == 0:
            break
        while n > 0:
            data += got
            lens += n.to_bytes(8, order, signed=True)
            if len(data) >= room:
                break
            n, got = get()
        if n < 0:
            return 1
    return 0
