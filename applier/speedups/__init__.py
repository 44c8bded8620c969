"""The hot loops, in C or in Python: chosen once, here.

Each function below has two implementations side by side in this package: a
C one (the ``.c`` files, built into ``applier.speedups._speedups`` with the
wheel or the editable install by ``hatch_build.py``) and its Python twin (the
``.py`` file of the same name), which stays the reference: the tests check
that both give the same results and raise the same error types, on random and
malformed input. As psycopg chooses its ``pq`` implementation, the choice is
made once, at import: C when the module is built and ``APPLIER_PURE_PYTHON``
is not set (to a non-empty value), else Python. Callers import the functions
from here and never ask which runs; :func:`describe` says it (``applier
--version``, and the worker's start-up line in the run log).

==================  ===========================================  ==================
function            what                                         twins
==================  ===========================================  ==================
tuple_data          one TupleData: (kinds, values, end) | None   tuples.c/.py
copy_text_row,      COPY text/binary framing of a row; an        copyrun.c/.py
copy_binary_row,    Insert's TupleData straight to its line,
tuple_text_line(s)  alone or for a run
row_decoders        Begin/Commit/Insert/Update/Delete decoders   decoder.c/.py
take_xlog           the stream's read loop                       takeloop.c/.py
fill_copy           the read-ahead's fill                        readahead.c/.py
hold_rows           the merge lane's loop                        mergelane.c/.py
dispatch_batch      the apply worker's loop over a batch         dispatch.c/.py
==================  ===========================================  ==================

The C functions are given what they read (callables, lists, classes) and read
no attribute of an object they do not own. The C files share ``speedups.h``
and ``copydata.h`` (the XLogData header, whose Python definition is
:mod:`applier.protocol.copydata`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol

from . import copyrun as _copyrun
from . import decoder as _decoder
from . import dispatch as _dispatch
from . import mergelane as _mergelane
from . import readahead as _readahead
from . import takeloop as _takeloop
from . import tuples as _tuples
from .mergelane import MAX_KEY

__all__ = [
    "FUNCTIONS",
    "IMPLEMENTATION",
    "MAX_KEY",
    "Flag",
    "ReadTuple",
    "copy_binary_row",
    "copy_text_row",
    "describe",
    "dispatch_batch",
    "fill_copy",
    "hold_rows",
    "missing",
    "row_decoders",
    "take_xlog",
    "tuple_data",
    "tuple_reader",
    "tuple_text_line",
    "tuple_text_lines",
]

Row = Sequence[bytes | None]
#: What :data:`tuple_data` reads: ``(kinds, values, end)``, or None if malformed.
ReadTuple = Callable[[bytes, int], tuple[bytes, tuple[bytes | None, ...], int] | None]
RowDecoder = Callable[[bytes], Any]


class StopFlag(Protocol):
    """A :data:`Flag`: false until set."""

    def set(self) -> None: ...
    def clear(self) -> None: ...
    def __bool__(self) -> bool: ...


#: Every function the C module must have: one built from older sources lacks some.
FUNCTIONS = (
    "tuple_data", "copy_text_row", "copy_binary_row", "tuple_text_line", "tuple_text_lines",
    "take_xlog", "fill_copy", "dispatch_batch", "Flag", "hold_rows", "bind_rows",
    "decode_begin", "decode_commit", "decode_insert", "decode_update", "decode_delete",
)  # fmt: skip


def missing(module: ModuleType) -> list[str]:
    """The :data:`FUNCTIONS` that ``module`` lacks."""
    return [name for name in FUNCTIONS if not hasattr(module, name)]


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("APPLIER_PURE_PYTHON"):
        return None, "pure Python (APPLIER_PURE_PYTHON is set)"
    try:
        from applier.speedups import _speedups
    except ImportError as exc:
        return None, f"pure Python (the C speedups are not built: {exc})"
    gone = missing(_speedups)
    if gone:  # a development tree updated without rebuilding: run, but say so
        return None, (
            f"pure Python (the C speedups were built from older sources, without "
            f"{', '.join(gone)}: rebuild them with scripts/setup or python hatch_build.py)"
        )
    return _speedups, "C speedups"


_native, _why = _load()
#: "C" or "python": which implementation runs.
IMPLEMENTATION = "python" if _native is None else "C"

#: ``(kinds, values, end)`` of the TupleData at ``pos``, or None if it is malformed.
tuple_data: ReadTuple
#: The decoder's TupleData reader, given its constructor and error: see tuples.py.
tuple_reader: Callable[
    [Callable[[bytes, tuple[bytes | None, ...]], Any], Callable[[bytes, int, str], Any]],
    Callable[[bytes, int, str], tuple[Any, int]],
]
#: One line of COPY text format / one tuple of COPY binary format.
copy_text_row: Callable[[Row], bytes]
copy_binary_row: Callable[[Row], bytes]
#: An INSERT's TupleData straight to ``(COPY text line, width)``, or ``(None, -1)``.
tuple_text_line: Callable[[bytes, int], tuple[bytes | None, int]]
#: The joined lines of a run of INSERTs of one width: ``(lines, count)``.
tuple_text_lines: Callable[[list[bytes], int, int, int, int], tuple[bytes, int]]
#: The stream client's read loop (applier.stream.takeloop): see takeloop.py.
take_xlog: Callable[..., int]
#: The apply worker's loop over a batch (applier.apply.worker): see dispatch.py.
dispatch_batch: Callable[
    [list[Any], dict[type, Any], Callable[[], Any], Callable[[Any, Any], object], StopFlag], None
]
#: Makes the stop request that dispatch_batch reads (a class, C or Python).
Flag: Callable[[], StopFlag]
#: The read-ahead's fill (applier.stream.readahead): see readahead.py.
fill_copy: Callable[
    [Callable[[], object], Callable[[], tuple[int, Any]], bytearray, bytearray, int], int
]
#: The merge lane's loop over a run of plain rows (applier.apply.batching.mergelane).
hold_rows: Callable[..., tuple[int, int]]
#: Begin, Commit, Insert, Update and Delete outside stream blocks, by tag, given
#: the classes to build and the decoder's own Python functions (see decoder.py).
row_decoders: Callable[[Sequence[type], Sequence[RowDecoder]], dict[str, RowDecoder]]


def _c_tuple_reader(
    new: Callable[[bytes, tuple[bytes | None, ...]], Any], error: Callable[[bytes, int, str], Any]
) -> Callable[[bytes, int, str], tuple[Any, int]]:
    """tuples.c's ``tuple_data`` as the decoder's reader (see tuples.py's twin)."""
    assert _native is not None
    read = _native.tuple_data

    def _tuple(data: bytes, pos: int, tag: str) -> tuple[Any, int]:
        got = read(data, pos)
        if got is None:
            return error(data, pos, tag)  # type: ignore[no-any-return]
        kinds, values, end = got
        return new(kinds, values), end

    return _tuple


def _c_row_decoders(classes: Sequence[type], twins: Sequence[RowDecoder]) -> dict[str, RowDecoder]:
    """decoder.c's decoders, once it was given the classes to build and the twins
    that word its errors."""
    assert _native is not None
    _native.bind_rows(*classes, tuple(twins))
    return {
        "B": _native.decode_begin,
        "C": _native.decode_commit,
        "I": _native.decode_insert,
        "U": _native.decode_update,
        "D": _native.decode_delete,
    }


if _native is None:
    tuple_data = _tuples.tuple_data
    tuple_reader = _tuples.tuple_reader
    copy_text_row = _copyrun.copy_text_row
    copy_binary_row = _copyrun.copy_binary_row
    tuple_text_line = _copyrun.tuple_text_line
    tuple_text_lines = _copyrun.tuple_text_lines
    take_xlog = _takeloop.take_xlog
    fill_copy = _readahead.fill_copy
    dispatch_batch = _dispatch.dispatch_batch
    Flag = _dispatch.Flag
    hold_rows = _mergelane.hold_rows
    row_decoders = _decoder.row_decoders
else:
    tuple_data = _native.tuple_data
    tuple_reader = _c_tuple_reader
    copy_text_row = _native.copy_text_row
    copy_binary_row = _native.copy_binary_row
    tuple_text_line = _native.tuple_text_line
    tuple_text_lines = _native.tuple_text_lines
    take_xlog = _native.take_xlog
    fill_copy = _native.fill_copy
    dispatch_batch = _native.dispatch_batch
    Flag = _native.Flag
    hold_rows = _native.hold_rows
    row_decoders = _c_row_decoders


def describe() -> str:
    """Which implementation of the hot loops runs, and why."""
    return _why
