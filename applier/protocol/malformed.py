"""What the pgoutput decoder raises for malformed bytes: one place for the wording.

Every refusal is a :class:`~applier.errors.DecodeError` naming the message (by
its human name), the byte offset (counted from the tag byte) and what is
wrong. Shared by :mod:`.decoder` (the messages) and :mod:`.tuples` (their
TupleData), which is why it is a module of its own: ``decoder`` imports
``tuples``, and neither needs the other for these.
"""

from __future__ import annotations

from typing import NoReturn

from applier.errors import DecodeError

__all__ = ["MESSAGE_NAMES", "Layout", "check_end", "fail", "need"]

#: Human names of the message tags, for errors.
MESSAGE_NAMES: dict[str, str] = {
    "B": "Begin",
    "C": "Commit",
    "O": "Origin",
    "R": "Relation",
    "Y": "Type",
    "I": "Insert",
    "U": "Update",
    "D": "Delete",
    "T": "Truncate",
    "M": "Message",
    "S": "Stream Start",
    "E": "Stream Stop",
    "c": "Stream Commit",
    "A": "Stream Abort",
    "b": "Begin Prepare",
    "P": "Prepare",
    "K": "Commit Prepared",
    "r": "Rollback Prepared",
    "p": "Stream Prepare",
}

# A field layout is a sequence of (name, size) used only to say which field a
# short message cuts off; "[name]" marks a String.
Layout = tuple[tuple[str, int], ...]


def fail(tag: str, offset: int, what: str) -> NoReturn:
    raise DecodeError(f"{MESSAGE_NAMES.get(tag, tag)} message: {what}", msg_type=tag, offset=offset)


def need(data: bytes, pos: int, layout: Layout, tag: str) -> None:
    """Raise naming the first field of ``layout`` (starting at ``pos``) that ``data`` cuts off."""
    for name, size in layout:
        if pos + size > len(data):
            fail(tag, pos, f"truncated: {name} needs {size} bytes, {len(data) - pos} left")
        pos += size


def check_end(data: bytes, pos: int, tag: str) -> None:
    if pos != len(data):
        fail(tag, pos, f"{len(data) - pos} trailing bytes after the end of the message")
