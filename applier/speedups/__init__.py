"""Where the per-row hot functions come from: the C module, or their pure-Python twins.

``applier.speedups._speedups`` (the C files beside this module, built with the
wheel or the editable install by ``hatch_build.py``) holds C versions of the
decoder's TupleData and row readers, of COPY's row framing, of the stream
client's read loop and fill, of the merge lane's loop and of the worker's
dispatch loop.
Each has a pure-Python twin that stays the reference: the tests check both give
the same results. The names
below are the C functions when the module was built and ``APPLIER_PURE_PYTHON``
is not set (to a non-empty value), else None; the modules that use them
(:mod:`applier.protocol.tuples`, :mod:`applier.apply.batching.copyrun`) bind the
chosen function once at import, so the choice costs nothing per row.

Nothing is logged at import; :func:`describe` says which was chosen and why,
for ``applier --version`` and debugging.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = [
    "FUNCTIONS",
    "bind_rows",
    "copy_binary_row",
    "copy_text_row",
    "describe",
    "dispatch_batch",
    "fill_copy",
    "missing",
    "row_decoders",
    "take_xlog",
    "tuple_data",
    "tuple_text_line",
    "tuple_text_lines",
]

Row = Sequence[bytes | None]
#: What :data:`tuple_data` reads: ``(kinds, values, end)``, or None if malformed.
ReadTuple = Callable[[bytes, int], tuple[bytes, tuple[bytes | None, ...], int] | None]


#: Every function the module must have: one built from older sources lacks some.
FUNCTIONS = (
    "tuple_data", "copy_text_row", "copy_binary_row", "tuple_text_line", "tuple_text_lines",
    "take_xlog", "fill_copy", "dispatch_batch", "hold_rows", "bind_rows",
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

#: ``(kinds, values, end)`` of the TupleData at ``pos``, or None if it is malformed.
tuple_data: ReadTuple | None
#: One line of COPY text format / one tuple of COPY binary format.
copy_text_row: Callable[[Row], bytes] | None
copy_binary_row: Callable[[Row], bytes] | None
#: An INSERT's TupleData straight to ``(COPY text line, width)``, or ``(None, -1)``.
tuple_text_line: Callable[[bytes, int], tuple[bytes | None, int]] | None
#: The joined lines of a run of INSERTs of one width: ``(lines, count)``.
tuple_text_lines: Callable[[list[bytes], int, int, int, int], tuple[bytes, int]] | None
#: The stream client's read loop (applier.stream.client): see ``take_xlog`` in takeloop.c.
take_xlog: Callable[..., int] | None
#: The apply worker's loop over a batch (applier.apply.worker): see ``dispatch_batch``
#: in dispatch.c.
dispatch_batch: (
    Callable[[list[Any], dict[type, Any], Callable[[], Any], Any, Callable[[], bool]], None] | None
)
#: The read-ahead's fill (applier.stream.readahead): see ``fill_copy`` in readahead.c.
fill_copy: Callable[[Any, Any, bytearray, bytearray, int], int] | None
#: The merge lane's loop over a run of plain rows (applier.apply.batching.mergelane._hold_rows_py).
hold_rows: Callable[..., tuple[int, int]] | None
#: Begin, Commit, Insert, Update and Delete outside stream blocks, by tag (the
#: twins: applier.protocol.decoder._begin ...), once ``bind_rows`` was called.
bind_rows: Callable[..., None] | None
row_decoders: dict[str, Callable[[bytes], Any]] | None
if _native is None:
    tuple_data = copy_text_row = copy_binary_row = tuple_text_line = take_xlog = fill_copy = None
    dispatch_batch = None
    tuple_text_lines = hold_rows = bind_rows = row_decoders = None
else:
    tuple_data = _native.tuple_data
    copy_text_row = _native.copy_text_row
    copy_binary_row = _native.copy_binary_row
    tuple_text_line = _native.tuple_text_line
    tuple_text_lines = _native.tuple_text_lines
    take_xlog = _native.take_xlog
    fill_copy = _native.fill_copy
    dispatch_batch = _native.dispatch_batch
    hold_rows = _native.hold_rows
    bind_rows = _native.bind_rows
    row_decoders = {
        "B": _native.decode_begin,
        "C": _native.decode_commit,
        "I": _native.decode_insert,
        "U": _native.decode_update,
        "D": _native.decode_delete,
    }


def describe() -> str:
    """Which implementation of the per-row functions runs, and why."""
    return _why
