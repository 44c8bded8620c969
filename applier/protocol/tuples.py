"""TupleData, the per-row part of Insert/Update/Delete: bytes at an offset in, values out.

Design: this is the applier's per-row cost, so one TupleData is read by
``tuple_data`` from :mod:`applier.speedups` (C when built, else its Python
twin, chosen once at import). Both read optimistically (no per-field checks)
and, on anything odd, give None: :func:`_tuple_error` then walks the bytes
again and raises a :class:`~applier.errors.DecodeError` naming the message,
the column and the offset of the bad field.

:func:`_tuple` (for the decoder and the copy lane) gives a :class:`TupleData`;
:func:`read_tuple` gives ``(kinds, values, end)`` or None, for the apply lanes
that skip the message objects.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from typing import NoReturn

from applier.speedups import ReadTuple, tuple_data, tuple_reader

from .malformed import fail as _fail
from .messages import TupleData, fast_constructor

__all__ = ["read_tuple"]

_U32 = Struct(">I")
_new_tuple = fast_constructor(TupleData)


#: The TupleData reader of the row messages (see applier.speedups for which runs).
_tuple: Callable[[bytes, int, str], tuple[TupleData, int]]

#: ``(kinds, values, end)`` of the TupleData at ``pos``, None if it is malformed (the
#: decoder names what is wrong): for the apply lanes, which skip the message objects.
read_tuple: ReadTuple = tuple_data


def _tuple_error(data: bytes, pos: int, tag: str) -> NoReturn:
    """Walk a TupleData the fast path refused and raise for the first bad field."""
    size = len(data)
    if pos + 2 > size:
        _fail(tag, pos, f"truncated: TupleData column count needs 2 bytes, {size - pos} left")
    n = data[pos] << 8 | data[pos + 1]
    p = pos + 2
    for i in range(n):
        if p >= size:
            _fail(tag, p, f"truncated: TupleData has {n} columns, column {i} is missing")
        k = data[p]
        if k in (110, 117):
            p += 1
            continue
        if k not in (116, 98):
            _fail(tag, p, f"unknown TupleData column kind {k!r} in column {i}")
        if p + 5 > size:
            _fail(tag, p + 1, f"truncated: length of column {i} needs 4 bytes, {size - p - 1} left")
        length = _U32.unpack_from(data, p + 1)[0]
        if p + 5 + length > size:
            _fail(tag, p + 1, f"column {i} length {length} exceeds the {size - p - 5} bytes left")
        p += 5 + length
    _fail(tag, pos, "malformed TupleData")  # unreachable unless the fast path is wrong


_tuple = tuple_reader(_new_tuple, _tuple_error)
