"""The merge lane's loop in Python: the twin of ``hold_rows`` in mergelane.c.

:func:`hold_rows` holds a run of streamed UPDATEs or DELETEs of one table
(a :class:`~applier.protocol.StreamedRun`'s bytes) in the merger's rows by
key, for :class:`applier.apply.batching.mergelane.MergeLane`, which uses the
chosen function.
"""

from __future__ import annotations

from typing import Any

from .tuples import tuple_data

__all__ = ["MAX_KEY", "hold_rows"]

#: Key columns :func:`hold_rows` holds at most (PostgreSQL's default INDEX_MAX_KEYS).
MAX_KEY = 32
_U = ord("u")


def hold_rows(
    datas: list[bytes],
    lsns: list[int],
    start: int,
    width: int,
    key: tuple[int, ...],
    rows: Any,
    keys: set[Any] | None,
    txn: object,
    no: int,
    size: int,
    max_rows: int,
    max_bytes: int,
) -> tuple[int, int]:
    """Hold ``datas[start:]`` in the merger's ``rows`` (with ``keys``: a DELETE
    holder's list and key set; without: an UPDATE holder's dict, newest values by
    key) until a row this cannot hold plainly, or after the row that brings the
    rows to ``max_rows`` or ``size`` to ``max_bytes``; how many, and the new size.

    Each row is ``(values, kinds, (lsn, data, no, txn))``, ``no`` counting on.
    Left to the caller: a malformed row or one not ``width`` wide, any unchanged
    TOAST value (``u``), a DELETE of a key held already, and every row of a key
    of more than :data:`MAX_KEY` columns. ``datas`` holds bytes (the stream's
    payloads): another type is a TypeError. The C twin (``hold_rows`` in
    mergelane.c) computes exactly this.
    """
    if len(key) > MAX_KEY:
        return 0, size
    if start < 0 or not all(0 <= c < width for c in key):  # as the C twin, row or not
        raise ValueError("hold_rows: start < 0, or a key column outside the width")
    k0 = key[0] if len(key) == 1 else -1
    j, n = start, len(datas)
    while j < n:
        data = datas[j]
        if type(data) is not bytes:  # as the C twin: a memoryview's rows were held
            raise TypeError("hold_rows: datas must hold bytes")
        got = tuple_data(data, 10)
        if got is None:
            break
        kinds, values, end = got
        if end != len(data) or len(kinds) != width or _U in kinds:
            break
        k = values[k0] if k0 >= 0 else tuple([values[c] for c in key])
        ref = (lsns[j], data, no, txn)
        if keys is None:
            rows[k] = (values, kinds, ref)
            size += len(data)
        else:
            if k in keys:
                break
            keys.add(k)
            rows.append((values, kinds, ref))
        no += 1
        j += 1
        if len(rows) >= max_rows or size >= max_bytes:
            break
    return j - start, size
