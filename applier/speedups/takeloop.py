"""The stream's read loop in Python: the twin of ``take_xlog`` in takeloop.c.

:func:`take_xlog` takes the CopyData that ``get()`` gives (libpq's buffered
messages, or a fill of the read-ahead read in place) into a batch, each
XLogData decoded by the decoder's handler for its tag, for
:class:`applier.stream.takeloop.TakeLoop`, which uses the chosen function
and handles what comes back (a keepalive, the COPY's end, an error).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import index
from struct import Struct
from typing import Any

__all__ = ["take_xlog"]

#: Bytes of a streamed Insert/Update/Delete that a run shares: tag, xid,
#: relation, the kind of its (first) tuple; and of an Insert outside a stream
#: block: tag, relation, 'N'.
GROUP_HEAD = 10
PLAIN_HEAD = 6
_U32 = Struct(">I")
_ROW_TAGS = frozenset(b"IUD")
_TUPLE_KINDS = frozenset(b"NKO")
_N = ord("N")


def _chunk(cursor: list[Any]) -> Callable[[], tuple[int, bytes]]:
    """A get() over a read-ahead cursor ``[data, lens, i, pos]``, which it moves."""
    if len(cursor) != 4:
        raise TypeError("take_xlog: a chunk is [data, lens, i, pos]")
    data, lens = memoryview(cursor[0]), cursor[1]
    if getattr(lens, "typecode", None) != "q" or cursor[2] < 0 or cursor[3] < 0:
        raise TypeError("take_xlog: a chunk's lens must be an array('q')")

    def get() -> tuple[int, bytes]:
        i, pos = cursor[2], cursor[3]
        if i >= len(lens):
            return 0, b""
        n = lens[i]
        if n <= 0 or n > len(data) - pos:
            raise ValueError("take_xlog: a chunk's lengths overrun its data")
        cursor[2], cursor[3] = i + 1, pos + n
        return n, data[pos : pos + n].tobytes()

    return get


def take_xlog(
    get: Any,
    table: list[Callable[[bytes], Any]],
    decode: Callable[[bytes], Any],
    out: list[Any],
    room: int,
    lsn_type: Callable[[int], Any],
    state: list[Any],
    group: tuple[type, type, type, Callable[..., Any]] | None = None,
) -> int:
    """Take what ``get()`` gives into ``out`` while it gives a message and fewer than
    ``room`` XLogData went in: each as ``(lsn_type(wal_start), table[tag](payload))``
    (``decode(payload)`` when the table has no entry: an empty payload).

    ``state`` is ``[count, nbytes, last, failed_lsn, other, sent]``, written back on
    every return, errors included. Status 0: nothing more, or ``room`` reached; 1:
    the COPY ended; 2: ``state[4]`` is a CopyData that is not an XLogData with a
    whole header. With ``group`` = (StreamedChange, StreamedRun, Insert, InsertRun),
    runs of streamed row changes of one head and of Inserts outside stream blocks
    into one relation go in as one item. ``get`` may be a read-ahead cursor, read
    in place. See takeloop.c for the whole contract.
    """
    # Imported here: applier.protocol imports this package (the chosen readers),
    # so this package cannot import it at its own import.
    from applier.protocol.copydata import XLOG_HEADER, XLOG_PAYLOAD_AT, XLOG_TAG

    if type(table) is not list:
        raise TypeError("take_xlog: table must be a list")
    if group is not None and (type(group) is not tuple or len(group) != 4):
        raise TypeError("take_xlog: group must be (StreamedChange, StreamedRun, Insert, InsertRun)")
    if type(out) is not list or type(state) is not list or len(state) != 6:
        raise TypeError("take_xlog: out must be a list, state a list of 6")
    change_type, run_type, insert_type, insert_run = group or (None, None, None, None)
    room = index(room)
    count, nbytes, last, sent = index(state[0]), index(state[1]), index(state[2]), index(state[5])
    if type(get) is list:
        get = _chunk(get)
    unpack = XLOG_HEADER.unpack_from
    run_datas: list[bytes] | None = None
    run_lsns: list[int] = []
    run_head = b""
    lone_head: bytes | None = None  # the last item is a lone Insert with this head
    status = 0
    try:
        while room > 0:
            got = get()
            if type(got) is not tuple or len(got) != 2:
                raise TypeError("take_xlog: get() must return (n, data)")
            n, data = got
            n = index(n)
            if n <= 0:
                status = 1 if n == -1 else 0
                break
            view = memoryview(data)
            count += 1
            nbytes += n
            if len(view) < XLOG_PAYLOAD_AT or view[0] != XLOG_TAG:
                state[4] = data
                status = 2
                break
            start, end, sent = unpack(view, 1)
            payload = view.tobytes()[XLOG_PAYLOAD_AT:]
            if run_datas is not None and payload[: len(run_head)] == run_head:
                run_datas.append(payload)
                run_lsns.append(start)
                room -= 1
                last = max(last, end)
                continue
            run_datas = None
            if lone_head is not None and payload[:PLAIN_HEAD] == lone_head:
                lone_head = None
                item = out[-1] if out else None
                if type(item) is tuple and len(item) == 2 and type(item[1]) is insert_type:
                    run_datas, run_lsns = [payload], [start]
                    run_head = payload[:PLAIN_HEAD]
                    assert insert_run is not None
                    out[-1] = (item[0], insert_run(item[1], run_datas, run_lsns))
                    room -= 1
                    last = max(last, end)
                    continue
            lone_head = None
            handler = table[payload[0]] if payload and payload[0] < len(table) else decode
            try:
                msg = handler(payload)
                if run_type is not None:
                    if type(msg) is change_type and _groupable(payload):
                        # The StreamedChange's xid, read where its handler read it.
                        xid = _U32.unpack_from(payload, 1)[0]
                        run_datas, run_lsns = [payload], [start]
                        run_head = payload[:GROUP_HEAD]
                        msg = run_type(xid, run_datas, run_lsns)
                    elif (
                        type(msg) is insert_type
                        and len(payload) >= PLAIN_HEAD
                        and payload[PLAIN_HEAD - 1] == _N
                    ):
                        lone_head = payload[:PLAIN_HEAD]
            except BaseException:
                state[3] = start
                raise
            out.append((lsn_type(start), msg))
            room -= 1
            last = max(last, end)
    finally:
        state[5], state[0], state[1], state[2] = sent, count, nbytes, last
    return status


def _groupable(payload: bytes) -> bool:
    """A streamed Insert, Update or Delete with its xid, relation and tuple kind."""
    return len(payload) >= GROUP_HEAD and payload[0] in _ROW_TAGS and payload[9] in _TUPLE_KINDS
