"""Runs of row changes read as one item, and their COPY lines made at once.

With ``group_streamed`` the C read loop hands consecutive streamed changes that
start with the same bytes (tag, xid, relation, tuple kind) over as one
:class:`StreamedRun`, and consecutive Inserts into one relation outside stream
blocks as one :class:`InsertRun`. Expanding every run must give back exactly
what the ungrouped read gives, message for message and position for position,
and a run must end at anything else: another head, another message, a
keepalive. Then
``tuple_text_lines`` (C) must join exactly the lines ``tuple_text_line`` makes
one by one, stopping where its Python twin stops.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_helpers import fake_stream

from applier import speedups
from applier.lsn import Lsn
from applier.protocol import (
    Begin,
    Commit,
    Delete,
    Insert,
    InsertRun,
    StreamedChange,
    StreamedRun,
    StreamStart,
    StreamStop,
    TupleData,
    Update,
    decode_insert,
    encode,
    keepalive,
    xlogdata,
)
from applier.speedups import copyrun as py_copyrun


def _row(i: int) -> TupleData:
    return TupleData.text(str(i).encode(), b"v\t" * (i % 3))


def _key(i: int) -> TupleData:
    return TupleData.text(str(i).encode(), None)


#: (message, inside a stream block), or None for a keepalive.
_SCRIPT: list[tuple[Any, bool] | None] = [
    (StreamStart(7, True), False),
    *[(Insert(7, 1, _row(i)), True) for i in range(3)],  # run of 3
    (Insert(7, 2, _row(3)), True),  # another relation: run of 1
    *[(Insert(8, 1, _row(i)), True) for i in range(4, 6)],  # a subtransaction: run of 2
    *[(Insert(7, 1, _row(i)), True) for i in range(6, 8)],  # back: run of 2
    None,  # a keepalive ends it
    (Insert(7, 1, _row(8)), True),  # run of 1
    *[(Update(7, 1, None, None, _row(i)), True) for i in range(9, 11)],  # run of 2
    (Update(7, 1, _key(1), "K", _row(11)), True),  # an old key: another head
    *[(Delete(7, 1, _key(i), "K"), True) for i in range(12, 15)],  # run of 3
    (StreamStop(), False),
    (Begin(Lsn(0x9000), 0, 9), False),
    *[(Insert(None, 1, _row(i)), False) for i in range(15, 18)],  # not streamed: run of 3
    (Insert(None, 2, _row(18)), False),  # another relation: alone (a keepalive next)
    None,
    *[(Insert(None, 2, _row(i)), False) for i in range(19, 21)],  # run of 2
    (Commit(0, Lsn(0x9000), Lsn(0x9100), 0), False),
]
_RUNS = [3, 1, 2, 2, 1, 2, 1, 3]
_INSERT_RUNS = [3, 1, 2]  # Inserts outside stream blocks, by run


def _frames() -> list[bytes]:
    frames = []
    for i, step in enumerate(_SCRIPT):
        lsn = 0x1000 + 0x10 * i
        if step is None:
            frames.append(keepalive(lsn, 0))
        else:
            msg, inside = step
            frames.append(xlogdata(lsn, lsn + 8, 0, encode(msg, 2, inside)))
    return frames


def _expand(items: list[tuple[Lsn, Any]]) -> list[tuple[Lsn, Any]]:
    flat: list[tuple[Lsn, Any]] = []
    for lsn, msg in items:
        if type(msg) is StreamedRun:
            assert lsn == msg.lsns[0]
            flat += [
                (Lsn(at), StreamedChange(msg.xid, d))
                for at, d in zip(msg.lsns, msg.datas, strict=True)
            ]
        elif type(msg) is InsertRun:
            assert lsn < msg.lsns[0]
            flat += [(lsn, msg.first)]
            flat += [(Lsn(at), decode_insert(d)) for at, d in zip(msg.lsns, msg.datas, strict=True)]
        else:
            flat.append((lsn, msg))
    return flat


def test_runs_expand_to_the_ungrouped_read() -> None:
    plain, _ = fake_stream(2, _frames(), defer_streamed=True)
    want = plain.read(0)
    grouped, _ = fake_stream(2, _frames(), defer_streamed=True, group_streamed=True)
    got = grouped.read(0)
    assert _expand(got) == want
    assert [len(m.datas) for _, m in got if type(m) is StreamedRun] == _RUNS
    # A run of Inserts is its first and the others; a lone Insert stays an Insert.
    assert [1 + len(m.datas) for _, m in got if type(m) is InsertRun] == [3, 2]
    assert all(len({d[:10] for d in m.datas}) == 1 for _, m in got if type(m) is StreamedRun)
    assert grouped.last_received == plain.last_received
    assert grouped.messages_received == plain.messages_received == len(_SCRIPT)
    assert sum(type(m) is StreamedChange for _, m in want) == sum(_RUNS)
    assert sum(type(m) is Insert for _, m in want) == sum(_INSERT_RUNS)


def test_no_runs_unless_asked() -> None:
    stream, _ = fake_stream(2, _frames(), defer_streamed=True)
    assert not any(type(m) in (StreamedRun, InsertRun) for _, m in stream.read(0))


# ------------------------------------------------------------------ COPY lines


@st.composite
def _rows(draw: st.DrawFn) -> list[bytes]:
    """INSERT messages (``'I' xid relid 'N'`` + TupleData), mostly 2 text columns."""
    datas = []
    for _ in range(draw(st.integers(0, 8))):
        kinds = bytes(draw(st.lists(st.sampled_from(b"tttnb"), min_size=2, max_size=3)))
        values = tuple(None if k == ord("n") else draw(st.binary(max_size=12)) for k in kinds)
        datas.append(encode(Insert(7, 1, TupleData(kinds, values)), 2, True))
    return datas


@settings(max_examples=300, deadline=None)
@given(datas=_rows(), start=st.integers(0, 8), limit=st.sampled_from([0, 1, 20, 1 << 20]))
def test_lines_join_what_each_row_makes(datas: list[bytes], start: int, limit: int) -> None:
    start = min(start, len(datas))
    got = speedups.tuple_text_lines(datas, start, 10, 2, limit)
    assert got == py_copyrun.tuple_text_lines(datas, start, 10, 2, limit)
    lines, n = got
    one_by_one = [speedups.tuple_text_line(d, 10) for d in datas[start : start + n]]
    assert lines == b"".join(line for line, _ in one_by_one if line is not None)
    assert all(line is not None and width == 2 for line, width in one_by_one)
    if start + n < len(datas) and len(lines) < limit:  # stopped at a row that is no line
        assert speedups.tuple_text_line(datas[start + n], 10)[1] != 2


def test_lines_refuse_a_start_past_the_end() -> None:
    for lines in (speedups.tuple_text_lines, py_copyrun.tuple_text_lines):
        assert lines is not None
        with pytest.raises(IndexError):
            lines([], 1, 10, 2, 100)


@pytest.mark.parametrize("group", [False, True])
def test_the_stream_keeps_the_last_send_time(group: bool) -> None:
    """The worker judges how far behind the source sends by the last XLogData's
    send_time (the source's clock): the C loop and its Python twin keep it, runs
    and all, across reads; a keepalive's time does not count."""
    frames = [
        xlogdata(0x100, 0x108, 1_000, encode(Begin(Lsn(0x900), 0, 9), 2, False)),
        *[
            xlogdata(0x110 + i, 0x118 + i, 2_000 + i, encode(Insert(None, 1, _row(i)), 2, False))
            for i in range(3)
        ],
        keepalive(0x200, 9_999),
    ]
    stream, pg = fake_stream(2, frames, defer_streamed=True, group_streamed=group)
    assert stream.last_send_time == 0
    got = stream.read(0)
    assert got and stream.last_send_time == 2_002
    pg.feed([xlogdata(0x300, 0x308, 3_000, encode(Commit(0, Lsn(0x900), Lsn(0x910), 0), 2, False))])
    stream.read(0)
    assert stream.last_send_time == 3_000
