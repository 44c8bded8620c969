"""TupleData reading in Python: the twin of ``tuple_data`` in tuples.c.

:func:`tuple_data` reads one TupleData (the per-row part of Insert, Update and
Delete) optimistically, with no per-field checks, and gives ``(kinds, values,
end)``, or None on anything odd: the caller (:mod:`applier.protocol.tuples`)
then walks the bytes again to raise the DecodeError that names the bad field.
Text columns (the common case) are not recorded in a kinds list: rows that
are all text share one kinds object, and other kinds are patched in afterwards.
"""

from __future__ import annotations

from struct import Struct
from struct import error as StructError

__all__ = ["tuple_data"]

# Bound once: attribute lookups cost more than the unpacking on the hot path.
_unpack_u32 = Struct(">I").unpack_from

# b"ttt..." for common column counts, so all-text tuples share one kinds object.
_ALL_TEXT = tuple(b"t" * n for n in range(128))


def tuple_data(data: bytes, pos: int) -> tuple[bytes, tuple[bytes | None, ...], int] | None:
    """``(kinds, values, end)`` of the TupleData at ``pos``, or None if it is malformed.

    One pass, no per-column objects but the value slices. Reads may run past the
    end (slices clamp silently), so the end position is checked once.
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
                return None
    except (IndexError, StructError):
        return None
    if p > len(data):
        return None
    if special is None:
        kinds = _ALL_TEXT[n] if n < 128 else b"t" * n
    else:
        patched = bytearray(b"t" * n)
        for i, k in special:
            patched[i] = k
        kinds = bytes(patched)
    return kinds, tuple(values), p
