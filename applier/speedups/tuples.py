"""TupleData reading in Python: the twin of ``tuple_data`` in tuples.c.

:func:`tuple_reader` makes the decoder's reader: it reads one TupleData (the
per-row part of Insert, Update and Delete) optimistically, with no per-field
checks, and gives what ``new(kinds, values)`` makes and the end, or on
anything odd what ``error(data, pos, tag)`` gives (the decoder's walks the
bytes again and raises the DecodeError that names the bad field).
:func:`tuple_data` is the same loop giving ``(kinds, values, end)`` or None, for
the lanes.
Text columns (the common case) are not recorded in a kinds list: rows that
are all text share one kinds object, and other kinds are patched in afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from struct import error as StructError
from typing import Any, TypeVar

__all__ = ["tuple_data", "tuple_reader"]

T = TypeVar("T")

# Bound once: attribute lookups cost more than the unpacking on the hot path.
_unpack_u32 = Struct(">I").unpack_from

# b"ttt..." for common column counts, so all-text tuples share one kinds object.
_ALL_TEXT = tuple(b"t" * n for n in range(128))


def tuple_reader(
    new: Callable[[bytes, tuple[bytes | None, ...]], T], error: Callable[[bytes, int, str], Any]
) -> Callable[[bytes, int, str], tuple[T, int]]:
    """The reader of the TupleData at ``pos``: ``(new(kinds, values), end)``, or
    ``error(data, pos, tag)`` if it is malformed. Built once: the loop is the
    decoder's per-row cost, so the constructor is called from it directly.

    One pass, no per-column objects but the value slices. Reads may run past the
    end (slices clamp silently), so the end position is checked once.
    """

    def read(data: bytes, pos: int, tag: str) -> tuple[T, int]:
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
                    return error(data, pos, tag)  # type: ignore[no-any-return]
        except (IndexError, StructError):
            return error(data, pos, tag)  # type: ignore[no-any-return]
        if p > len(data):
            return error(data, pos, tag)  # type: ignore[no-any-return]
        if special is None:
            kinds = _ALL_TEXT[n] if n < 128 else b"t" * n
        else:
            patched = bytearray(b"t" * n)
            for i, k in special:
                patched[i] = k
            kinds = bytes(patched)
        return new(kinds, tuple(values)), p

    return read


def _none(data: bytes, pos: int, tag: str) -> None:
    return None


_read = tuple_reader(lambda kinds, values: (kinds, values), _none)


def tuple_data(data: bytes, pos: int) -> tuple[bytes, tuple[bytes | None, ...], int] | None:
    """``(kinds, values, end)`` of the TupleData at ``pos``, or None if it is malformed."""
    got = _read(data, pos, "")
    if got is None:
        return None
    (kinds, values), end = got
    return kinds, values, end
