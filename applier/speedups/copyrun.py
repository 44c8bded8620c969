"""COPY framing in Python: the twins of copyrun.c.

Rows of protocol values to COPY's text and binary formats, and an INSERT's
TupleData straight to its COPY text line, alone or for a run of messages (the
copy lane). What the formats are and why is in
:mod:`applier.apply.sql.copyrun`, which uses the chosen functions.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from .tuples import tuple_data

__all__ = ["copy_binary_row", "copy_text_row", "tuple_text_line", "tuple_text_lines"]

_NULL_TEXT = b"\\N"
_NULL_BINARY = struct.pack(">i", -1)
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def _escape(v: bytes | memoryview) -> bytes:
    if type(v) is memoryview:  # `in` would compare its ints, and find nothing
        v = v.tobytes()
    if b"\\" in v:
        v = v.replace(b"\\", b"\\\\")
    if b"\t" in v:
        v = v.replace(b"\t", b"\\t")
    if b"\n" in v:
        v = v.replace(b"\n", b"\\n")
    if b"\r" in v:
        v = v.replace(b"\r", b"\\r")
    return v


def copy_text_row(params: Sequence[bytes | None]) -> bytes:
    """One line of COPY text format."""
    if None not in params:
        line = b"\t".join(params)  # type: ignore[arg-type]
        # Fast path: no value holds a tab, newline, CR or backslash.
        if (
            line.count(b"\t") == len(params) - 1
            and b"\\" not in line
            and b"\n" not in line
            and b"\r" not in line
        ):
            return line + b"\n"
    return b"\t".join([_NULL_TEXT if v is None else _escape(v) for v in params]) + b"\n"


def copy_binary_row(params: Sequence[bytes | None]) -> bytes:
    """One tuple of COPY binary format."""
    parts = [_INT16.pack(len(params))]
    for v in params:
        if v is None:
            parts.append(_NULL_BINARY)
        else:
            parts.append(_INT32.pack(len(v)))
            parts.append(v)
    return b"".join(parts)


def tuple_text_line(data: bytes, pos: int) -> tuple[bytes | None, int]:
    """The COPY text line of the TupleData at ``pos`` (ending ``data``) and its width;
    ``(None, -1)`` when a value is binary or an unchanged TOAST value, or the bytes
    are malformed (the decoder then says what is wrong)."""
    got = tuple_data(data, pos)
    if got is None:
        return None, -1
    kinds, values, end = got
    if end != len(data) or b"b" in kinds or b"u" in kinds:
        return None, -1
    return copy_text_row(values), len(kinds)


def tuple_text_lines(
    datas: list[bytes], start: int, pos: int, width: int, limit: int
) -> tuple[bytes, int]:
    """The lines of ``datas[start]``, ``datas[start + 1]``, ... joined, up to the first
    that makes no line or is not ``width`` wide, and none once ``limit`` bytes are
    reached; and how many."""
    if not 0 <= start <= len(datas):
        raise IndexError("tuple_text_lines: start out of range")
    lines: list[bytes] = []
    size = 0
    for data in datas[start:]:
        if size >= limit:
            break
        line, n = tuple_text_line(data, pos)
        if line is None or n != width:
            break
        lines.append(line)
        size += len(line)
    return b"".join(lines), len(lines)
