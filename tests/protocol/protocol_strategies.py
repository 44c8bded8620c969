"""Hypothesis strategies for every pgoutput message, with the context to encode it.

A *case* is ``(message, proto_version, in_stream)``: the protocol version and
stream state in which a walsender could send that message.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from applier.lsn import Lsn
from applier.protocol import (
    BINARY,
    NULL,
    TEXT,
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
)

Case = tuple[Any, int, bool]

u32 = st.integers(0, 2**32 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
lsn = st.integers(0, 2**64 - 1).map(Lsn)
ts = st.integers(-(2**63), 2**63 - 1)
# Names: any text without NUL (the protocol's terminator), incl. non-ASCII.
name = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=20)


@st.composite
def tuple_data(draw: st.DrawFn, max_cols: int = 8) -> TupleData:
    kinds = draw(
        st.lists(st.sampled_from((TEXT, TEXT, NULL, UNCHANGED_TOAST, BINARY)), max_size=max_cols)
    )
    values = tuple(draw(st.binary(max_size=40)) if k in (TEXT, BINARY) else None for k in kinds)
    return TupleData(bytes(kinds), values)


def _xid(in_stream: bool) -> st.SearchStrategy[int | None]:
    return u32 if in_stream else st.none()


@st.composite
def row_case(draw: st.DrawFn) -> Case:
    """Relation/Type/Insert/Update/Delete/Truncate/Message, in or out of a stream block."""
    in_stream = draw(st.booleans())
    proto = draw(st.integers(2, 4)) if in_stream else draw(st.integers(1, 4))
    xid = draw(_xid(in_stream))
    kind = draw(st.sampled_from("RYIUDTM"))
    msg: Any
    if kind == "R":
        cols = draw(st.lists(st.builds(Column, st.integers(0, 1), name, u32, i32), max_size=6))
        msg = Relation(
            xid, draw(u32), draw(name), draw(name), draw(st.sampled_from("dnfi")), tuple(cols)
        )
    elif kind == "Y":
        msg = Type(xid, draw(u32), draw(name), draw(name))
    elif kind == "I":
        msg = Insert(xid, draw(u32), draw(tuple_data()))
    elif kind == "U":
        old_kind = draw(st.sampled_from((None, "K", "O")))
        old = None if old_kind is None else draw(tuple_data())
        msg = Update(xid, draw(u32), old, old_kind, draw(tuple_data()))
    elif kind == "D":
        msg = Delete(xid, draw(u32), draw(tuple_data()), draw(st.sampled_from(("K", "O"))))
    elif kind == "T":
        msg = Truncate(xid, draw(st.integers(0, 3)), tuple(draw(st.lists(u32, max_size=5))))
    else:
        msg = Message(xid, draw(st.booleans()), draw(lsn), draw(name), draw(st.binary(max_size=40)))
    return msg, proto, in_stream


@st.composite
def txn_case(draw: st.DrawFn) -> Case:
    """Messages outside a stream block, with the lowest version that allows them."""
    kind = draw(st.sampled_from(["B", "C", "O", "S", "c", "A", "b", "P", "K", "r", "p"]))
    gid = name
    msg: Any
    low = 1
    if kind == "B":
        msg = Begin(draw(lsn), draw(ts), draw(u32))
    elif kind == "C":
        msg = Commit(0, draw(lsn), draw(lsn), draw(ts))
    elif kind == "O":
        msg = Origin(draw(lsn), draw(name))
    elif kind == "S":
        msg, low = StreamStart(draw(u32), draw(st.booleans())), 2
    elif kind == "c":
        msg, low = StreamCommit(draw(u32), 0, draw(lsn), draw(lsn), draw(ts)), 2
    elif kind == "A":
        if draw(st.booleans()):
            msg, low = StreamAbort(draw(u32), draw(u32), draw(lsn), draw(ts)), 4
        else:
            msg, low = StreamAbort(draw(u32), draw(u32)), 2
    elif kind == "b":
        msg, low = BeginPrepare(draw(lsn), draw(lsn), draw(ts), draw(u32), draw(gid)), 3
    elif kind == "P":
        msg, low = Prepare(0, draw(lsn), draw(lsn), draw(ts), draw(u32), draw(gid)), 3
    elif kind == "K":
        msg, low = CommitPrepared(0, draw(lsn), draw(lsn), draw(ts), draw(u32), draw(gid)), 3
    elif kind == "r":
        args = (draw(lsn), draw(lsn), draw(ts), draw(ts), draw(u32), draw(gid))
        msg, low = RollbackPrepared(0, *args), 3
    else:
        msg, low = StreamPrepare(0, draw(lsn), draw(lsn), draw(ts), draw(u32), draw(gid)), 3
    return msg, draw(st.integers(low, 4)), False


def stream_stop_case() -> st.SearchStrategy[Case]:
    return st.integers(2, 4).map(lambda proto: (StreamStop(), proto, True))


any_case: st.SearchStrategy[Case] = st.one_of(row_case(), txn_case(), stream_stop_case())
