"""TupleData, the per-row part of Insert/Update/Delete: bytes at an offset in, values out.

Design: this is the applier's per-row cost, so one TupleData is read in C when
``applier.speedups._speedups`` is built (``speedups.tuple_data``, chosen once
at import, see :mod:`applier.speedups`). :func:`_tuple_py` is its
pure-Python twin: the fallback, the reference, and what the tests run with
``APPLIER_PURE_PYTHON=1``; both accept exactly the same bytes. Both read
optimistically (no per-field checks) and, on anything odd, hand over to
:func:`_tuple_error`, which walks the bytes again and raises a
:class:`~applier.errors.DecodeError` naming the message, the column and the
offset of the bad field.

:func:`_tuple` (the chosen reader, for the decoder and the copy lane) gives a
:class:`TupleData`; :func:`read_tuple` gives ``(kinds, values, end)`` or None,
for the apply lanes that skip the message objects.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from struct import error as StructError
from typing import NoReturn

from applier import speedups
from applier.errors import DecodeError

from .malformed import fail as _fail
from .messages import TupleData, fast_constructor

__all__ = ["read_tuple"]

_U32 = Struct(">I")
# Bound once: attribute lookups cost more than the unpacking on the hot path.
_unpack_u32 = _U32.unpack_from
_new_tuple = fast_constructor(TupleData)

# b"ttt..." for common column counts, so all-text tuples share one kinds object.
_ALL_TEXT = tuple(b"t" * n for n in range(128))


def _tuple_py(data: bytes, pos: int, tag: str) -> tuple[TupleData, int]:
    """Decode TupleData at ``pos``; return it and the position after it.

    One pass, no per-column objects but the value slices. Text columns (the
    common case) are not recorded in a kinds list: rows that are all text
    share one kinds object, and other kinds are patched in afterwards. Reads
    may run past the end (slices clamp silently), so the end position is
    checked once; any oddity hands over to :func:`_tuple_error`.
    """
    try:
        n = data[pos] << 8 | data[pos + 1]
        p = pos + 2
        values: list[bytes | None] = []
        append = values.append
        special = None
        for i in range(n):
            k = data[p]
            if k == 116:  # 't'
                p += 5
                end = p + _unpack_u32(data, p - 4)[0]
                append(data[p:end])
                p = end
            elif k == 110 or k == 117:  # 'n', 'u'
                append(None)
                p += 1
                special = [] if special is None else special
                special.append((i, k))
            elif k == 98:  # 'b'
                p += 5
                end = p + _unpack_u32(data, p - 4)[0]
                append(data[p:end])
                p = end
                special = [] if special is None else special
                special.append((i, k))
            else:
                break
        else:
            if p <= len(data):
                if special is None:
                    kinds = _ALL_TEXT[n] if n < 128 else b"t" * n
                else:
                    patched = bytearray(b"t" * n)
                    for i, k in special:
                        patched[i] = k
                    kinds = bytes(patched)
                return _new_tuple(kinds, tuple(values)), p
    except (IndexError, StructError):
        pass
    _tuple_error(data, pos, tag)


_TupleReader = Callable[[bytes, int, str], tuple[TupleData, int]]


def _native_tuple(read: speedups.ReadTuple) -> _TupleReader:
    """:func:`_tuple_py` with its loop in C (``speedups.tuple_data``), the same errors."""

    def _tuple_c(data: bytes, pos: int, tag: str) -> tuple[TupleData, int]:
        got = read(data, pos)
        if got is None:
            _tuple_error(data, pos, tag)
        kinds, values, end = got
        return _new_tuple(kinds, values), end

    return _tuple_c


#: The TupleData reader of the row messages: C when built (see applier.speedups).
_tuple = _tuple_py if speedups.tuple_data is None else _native_tuple(speedups.tuple_data)


def _read_tuple_py(data: bytes, pos: int) -> tuple[bytes, tuple[bytes | None, ...], int] | None:
    try:
        t, end = _tuple_py(data, pos, "?")
    except DecodeError:
        return None
    return t.kinds, t.values, end


#: ``(kinds, values, end)`` of the TupleData at ``pos``, None if it is malformed (the
#: decoder names what is wrong): for the apply lanes, which skip the message objects.
read_tuple: speedups.ReadTuple = speedups.tuple_data or _read_tuple_py


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
