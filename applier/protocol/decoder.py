"""pgoutput decoder: one logical replication message (bytes) in, one typed message out.

Byte layouts (all integers big-endian; ``String`` is NUL-terminated UTF-8;
``[Int32 xid]`` is present only inside a stream block, i.e. between Stream
Start and Stream Stop; "v2+" means protocol version 2 or later)::

    Begin             'B' Int64 final_lsn, Int64 commit_ts, Int32 xid
    Commit            'C' Int8 flags(=0), Int64 commit_lsn, Int64 end_lsn, Int64 commit_ts
    Origin            'O' Int64 origin_lsn, String name
    Relation          'R' [Int32 xid] Int32 oid, String namespace, String name,
                          Int8 replident('d'|'n'|'f'|'i'), Int16 ncols,
                          ncols * (Int8 flags(0|1), String name, Int32 type_oid, Int32 atttypmod)
    Type              'Y' [Int32 xid] Int32 oid, String namespace, String name
    Insert            'I' [Int32 xid] Int32 relation_oid, 'N' TupleData
    Update            'U' [Int32 xid] Int32 relation_oid, [('K'|'O') TupleData], 'N' TupleData
    Delete            'D' [Int32 xid] Int32 relation_oid, ('K'|'O') TupleData
    Truncate          'T' [Int32 xid] Int32 nrels, Int8 options(bits 1|2), nrels * Int32 oid
    Message           'M' [Int32 xid] Int8 flags(0|1 transactional), Int64 lsn, String prefix,
                          Int32 length, Byte[length] content
    Stream Start      'S' Int32 xid, Int8 first_segment(0|1)                       v2+
    Stream Stop       'E'                                                          v2+
    Stream Commit     'c' Int32 xid, Int8 flags(=0), Int64 commit_lsn, Int64 end_lsn,
                          Int64 commit_ts                                          v2+
    Stream Abort      'A' Int32 xid, Int32 subxid                                  v2+
                          [Int64 abort_lsn, Int64 abort_ts]   v4+ with streaming=parallel
    Begin Prepare     'b' Int64 prepare_lsn, Int64 end_lsn, Int64 prepare_ts, Int32 xid,
                          String gid                                               v3+
    Prepare           'P' Int8 flags(=0), Int64 prepare_lsn, Int64 end_lsn, Int64 prepare_ts,
                          Int32 xid, String gid                                    v3+
    Commit Prepared   'K' Int8 flags(=0), Int64 commit_lsn, Int64 end_lsn, Int64 commit_ts,
                          Int32 xid, String gid                                    v3+
    Rollback Prepared 'r' Int8 flags(=0), Int64 prepare_end_lsn, Int64 rollback_end_lsn,
                          Int64 prepare_ts, Int64 rollback_ts, Int32 xid, String gid  v3+
    Stream Prepare    'p' Int8 flags(=0), Int64 prepare_lsn, Int64 end_lsn, Int64 prepare_ts,
                          Int32 xid, String gid                                    v3+

    TupleData             Int16 ncols, ncols * one of:
                          'n' (NULL) | 'u' (unchanged TOAST) |
                          't' Int32 length, Byte[length] | 'b' Int32 length, Byte[length]

LSNs, xids and OIDs are unsigned; timestamps and atttypmod are signed. A
message is exactly one CopyData payload, so a message that ends before its
last field or goes on after it is an error.

Design: the hot path (Insert/Update/Delete and their TupleData) is written for
speed, not for error messages. It reads optimistically with precompiled
``struct.Struct.unpack_from`` and byte indexing, lets slicing run past the end
and checks the final position once. When anything is off it hands over to a
slow validator that walks the bytes again, carefully, and raises
:class:`~applier.errors.DecodeError` with the message tag and the offset of the
offending field. So valid input pays for no checks it does not need, and
invalid input still gets a precise error. The TupleData reader, the per-row
cost, is :mod:`.tuples` (in C when ``applier.speedups._speedups`` is built,
with a pure-Python twin; the same slow validator names the error either way);
the wording of every refusal is :mod:`.malformed`. Outside stream blocks,
Begin, Commit, Insert, Update and Delete are decoded whole in C when it is
built (``applier/speedups/decoder.c``); the functions here are their twins, and take whatever
the C does not decode (so every error is still raised, and worded, here).
Offsets count from the tag byte (offset 0). A truncated field is reported at
the offset where it starts; a bad value at the offset of the field holding it;
trailing bytes at the offset where the message should have ended.

The only state is what the protocol needs: whether we are inside a stream
block (xid prefixes). It only changes when a Stream Start/Stop decodes fully.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from struct import error as StructError
from typing import NoReturn

from applier.errors import DecodeError
from applier.lsn import Lsn
from applier.speedups import row_decoders

from .malformed import MESSAGE_NAMES
from .malformed import Layout as _Layout
from .malformed import check_end as _check_end
from .malformed import fail as _fail
from .malformed import need as _need
from .messages import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamedChange,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
    fast_constructor,
)
from .tuples import _tuple

__all__ = [
    "MESSAGE_NAMES",
    "MIN_PROTO_VERSION",
    "PgOutputDecoder",
    "decode_insert",
    "decode_streamed",
]

#: Lowest protocol version that may send each tag (others: 1).
MIN_PROTO_VERSION: dict[str, int] = {
    "S": 2, "E": 2, "c": 2, "A": 2,
    "b": 3, "P": 3, "K": 3, "r": 3, "p": 3,
}  # fmt: skip

_U8 = Struct(">B")
_U16 = Struct(">H")
_U32 = Struct(">I")
_U64 = Struct(">Q")
_BEGIN = Struct(">QqI")
_COMMIT = Struct(">BQQq")
_REL_ATT = Struct(">Ii")
_REL_TAIL = Struct(">BH")
_TRUNC = Struct(">IB")
_MSG = Struct(">BQ")
_SSTART = Struct(">IB")
_SCOMMIT = Struct(">IBQQq")
_SABORT = Struct(">II")
_SABORT4 = Struct(">IIQq")
_BPREP = Struct(">QQqI")
_PREP = Struct(">BQQqI")
_RBPREP = Struct(">BQQqqI")
_REL_MARK = Struct(">IB")
# Bound once: attribute lookups cost more than the unpacking on the hot path.
_unpack_u32 = _U32.unpack_from
_unpack_relid_marker = _REL_MARK.unpack_from
_unpack_begin = _BEGIN.unpack_from
_unpack_commit = _COMMIT.unpack_from

_BEGIN_L: _Layout = (("final_lsn", 8), ("commit_ts", 8), ("xid", 4))
_COMMIT_L: _Layout = (("flags", 1), ("commit_lsn", 8), ("end_lsn", 8), ("commit_ts", 8))
_SSTART_L: _Layout = (("xid", 4), ("first_segment", 1))
_SCOMMIT_L: _Layout = (("xid", 4), *_COMMIT_L)
_SABORT_L: _Layout = (("xid", 4), ("subxid", 4))
_SABORT4_L: _Layout = (*_SABORT_L, ("abort_lsn", 8), ("abort_ts", 8))
_BPREP_L: _Layout = (("prepare_lsn", 8), ("end_lsn", 8), ("prepare_ts", 8), ("xid", 4))
_PREP_L: _Layout = (("flags", 1), *_BPREP_L)
_CPREP_L: _Layout = (("flags", 1), ("commit_lsn", 8), ("end_lsn", 8), ("commit_ts", 8), ("xid", 4))
_RBPREP_L: _Layout = (
    ("flags", 1),
    ("prepare_end_lsn", 8),
    ("rollback_end_lsn", 8),
    ("prepare_ts", 8),
    ("rollback_ts", 8),
    ("xid", 4),
)

_new_begin = fast_constructor(Begin)
_new_commit = fast_constructor(Commit)
_new_insert = fast_constructor(Insert)
_new_update = fast_constructor(Update)
_new_delete = fast_constructor(Delete)
_new_stream_start = fast_constructor(StreamStart)
# Every row of a streamed transaction is one (the dataclass __init__ was ~6% of
# the applier's CPU on a 1M-row streamed insert).
_new_streamed = fast_constructor(StreamedChange)

_Handler = Callable[[bytes], PgOutputMessage]


# --------------------------------------------------------------------------- fields


def _fixed(data: bytes, pos: int, st: Struct, layout: _Layout, tag: str) -> tuple[int, ...]:
    """Unpack a fixed-size part at ``pos``; it must fit in ``data``."""
    if len(data) < pos + st.size:
        _need(data, pos, layout, tag)
    return st.unpack_from(data, pos)


def _fixed_whole(data: bytes, st: Struct, layout: _Layout, tag: str) -> tuple[int, ...]:
    """Unpack a message that is exactly a tag plus ``st``."""
    if len(data) != 1 + st.size:
        _need(data, 1, layout, tag)
        _check_end(data, 1 + st.size, tag)
    return st.unpack_from(data, 1)


def _string(data: bytes, pos: int, field: str, tag: str) -> tuple[str, int]:
    """Read a NUL-terminated UTF-8 string at ``pos``; return it and the position after the NUL."""
    end = data.find(0, pos)
    if end < 0:
        _fail(tag, pos, f"{field}: string has no terminating NUL")
    try:
        return data[pos:end].decode("utf-8"), end + 1
    except UnicodeDecodeError as exc:
        _fail(tag, pos + exc.start, f"{field}: invalid UTF-8 ({exc.reason})")


def _flag(value: int, allowed: tuple[int, ...], field: str, pos: int, tag: str) -> None:
    if value not in allowed:
        _fail(tag, pos, f"unknown {field} {value}")


# ------------------------------------------------------------------- row messages


def _relid_marker_error(data: bytes, pos: int, tag: str) -> NoReturn:
    _need(data, pos, (("relation_oid", 4), ("tuple marker", 1)), tag)
    raise AssertionError("unreachable")


def _insert(data: bytes, pos: int = 1, xid: int | None = None) -> Insert:
    try:
        relid, marker = _unpack_relid_marker(data, pos)
    except StructError:
        _relid_marker_error(data, pos, "I")
    if marker != 78:  # 'N'
        _fail("I", pos + 4, f"expected 'N' before the new tuple, got {marker!r}")
    new, end = _tuple(data, pos + 5, "I")
    if end != len(data):
        _check_end(data, end, "I")
    return _new_insert(xid, relid, new)


def _update(data: bytes, pos: int = 1, xid: int | None = None) -> Update:
    try:
        relid, marker = _unpack_relid_marker(data, pos)
    except StructError:
        _relid_marker_error(data, pos, "U")
    pos += 4
    old = None
    old_kind = None
    if marker == 75 or marker == 79:  # 'K', 'O'
        old_kind = "K" if marker == 75 else "O"
        old, pos = _tuple(data, pos + 1, "U")
        if pos >= len(data):
            _fail("U", pos, "truncated: the new tuple is missing")
        marker = data[pos]
    if marker != 78:
        _fail("U", pos, f"expected 'K', 'O' or 'N' tuple marker, got {marker!r}")
    new, end = _tuple(data, pos + 1, "U")
    if end != len(data):
        _check_end(data, end, "U")
    return _new_update(xid, relid, old, old_kind, new)


def _delete(data: bytes, pos: int = 1, xid: int | None = None) -> Delete:
    try:
        relid, marker = _unpack_relid_marker(data, pos)
    except StructError:
        _relid_marker_error(data, pos, "D")
    if marker != 75 and marker != 79:
        _fail("D", pos + 4, f"expected 'K' or 'O' tuple marker, got {marker!r}")
    old, end = _tuple(data, pos + 5, "D")
    if end != len(data):
        _check_end(data, end, "D")
    return _new_delete(xid, relid, old, "K" if marker == 75 else "O")


def _truncate(data: bytes, pos: int = 1, xid: int | None = None) -> Truncate:
    nrels, options = _fixed(data, pos, _TRUNC, (("nrels", 4), ("options", 1)), "T")
    if options & ~3:
        _fail("T", pos + 4, f"unknown options bits {options:#x}")
    pos += 5
    have = (len(data) - pos) // 4
    if have < nrels:
        _fail("T", pos + 4 * have, f"truncated: {nrels} relation ids announced, {have} present")
    end = pos + 4 * nrels
    _check_end(data, end, "T")
    oids = Struct(f">{nrels}I").unpack_from(data, pos)
    return Truncate(xid, options, oids)


# ------------------------------------------------------------------ other messages


def _begin(data: bytes) -> Begin:
    if len(data) != 21:
        _fixed_whole(data, _BEGIN, _BEGIN_L, "B")
    final_lsn, ts, xid = _unpack_begin(data, 1)
    return _new_begin(Lsn(final_lsn), ts, xid)


def _commit(data: bytes) -> Commit:
    if len(data) != 26:
        _fixed_whole(data, _COMMIT, _COMMIT_L, "C")
    flags, lsn, end_lsn, ts = _unpack_commit(data, 1)
    if flags:
        _fail("C", 1, f"unknown flags {flags}")
    return _new_commit(flags, Lsn(lsn), Lsn(end_lsn), ts)


def _origin(data: bytes) -> Origin:
    (lsn,) = _fixed(data, 1, _U64, (("origin_lsn", 8),), "O")
    name, pos = _string(data, 9, "name", "O")
    _check_end(data, pos, "O")
    return Origin(Lsn(lsn), name)


def _relation(data: bytes, pos: int = 1, xid: int | None = None) -> Relation:
    (oid,) = _fixed(data, pos, _U32, (("oid", 4),), "R")
    namespace, pos = _string(data, pos + 4, "namespace", "R")
    name, pos = _string(data, pos, "name", "R")
    replident, ncols = _fixed(data, pos, _REL_TAIL, (("replident", 1), ("ncols", 2)), "R")
    if replident not in b"dnfi":
        _fail("R", pos, f"unknown replica identity {replident!r}")
    pos += 3
    columns = []
    for _ in range(ncols):
        (flags,) = _fixed(data, pos, _U8, (("column flags", 1),), "R")
        _flag(flags, (0, 1), "column flags", pos, "R")
        colname, pos = _string(data, pos + 1, "column name", "R")
        typoid, typmod = _fixed(data, pos, _REL_ATT, (("type_oid", 4), ("atttypmod", 4)), "R")
        columns.append(Column(flags, colname, typoid, typmod))
        pos += 8
    _check_end(data, pos, "R")
    return Relation(xid, oid, namespace, name, chr(replident), tuple(columns))


def _type(data: bytes, pos: int = 1, xid: int | None = None) -> Type:
    (oid,) = _fixed(data, pos, _U32, (("oid", 4),), "Y")
    namespace, pos = _string(data, pos + 4, "namespace", "Y")
    name, pos = _string(data, pos, "name", "Y")
    _check_end(data, pos, "Y")
    return Type(xid, oid, namespace, name)


def _message(data: bytes, pos: int = 1, xid: int | None = None) -> Message:
    flags, lsn = _fixed(data, pos, _MSG, (("flags", 1), ("lsn", 8)), "M")
    _flag(flags, (0, 1), "flags", pos, "M")
    prefix, pos = _string(data, pos + 9, "prefix", "M")
    (length,) = _fixed(data, pos, _U32, (("content length", 4),), "M")
    pos += 4
    if pos + length > len(data):
        _fail("M", pos - 4, f"content length {length} exceeds the {len(data) - pos} bytes left")
    _check_end(data, pos + length, "M")
    return Message(xid, bool(flags), Lsn(lsn), prefix, data[pos : pos + length])


def _stream_commit(data: bytes) -> StreamCommit:
    xid, flags, lsn, end_lsn, ts = _fixed_whole(data, _SCOMMIT, _SCOMMIT_L, "c")
    if flags:
        _fail("c", 5, f"unknown flags {flags}")
    return StreamCommit(xid, flags, Lsn(lsn), Lsn(end_lsn), ts)


def _begin_prepare(data: bytes) -> BeginPrepare:
    lsn, end_lsn, ts, xid = _fixed(data, 1, _BPREP, _BPREP_L, "b")
    gid, pos = _string(data, 1 + _BPREP.size, "gid", "b")
    _check_end(data, pos, "b")
    return BeginPrepare(Lsn(lsn), Lsn(end_lsn), ts, xid, gid)


def _prepare_like(data: bytes, tag: str) -> tuple[int, int, int, int, int, str]:
    """Prepare, Commit Prepared and Stream Prepare share one layout."""
    layout = _CPREP_L if tag == "K" else _PREP_L
    flags, lsn, end_lsn, ts, xid = _fixed(data, 1, _PREP, layout, tag)
    if flags:
        _fail(tag, 1, f"unknown flags {flags}")
    gid, pos = _string(data, 1 + _PREP.size, "gid", tag)
    _check_end(data, pos, tag)
    return flags, lsn, end_lsn, ts, xid, gid


def _prepare(data: bytes) -> Prepare:
    flags, lsn, end_lsn, ts, xid, gid = _prepare_like(data, "P")
    return Prepare(flags, Lsn(lsn), Lsn(end_lsn), ts, xid, gid)


def _commit_prepared(data: bytes) -> CommitPrepared:
    flags, lsn, end_lsn, ts, xid, gid = _prepare_like(data, "K")
    return CommitPrepared(flags, Lsn(lsn), Lsn(end_lsn), ts, xid, gid)


def _stream_prepare(data: bytes) -> StreamPrepare:
    flags, lsn, end_lsn, ts, xid, gid = _prepare_like(data, "p")
    return StreamPrepare(flags, Lsn(lsn), Lsn(end_lsn), ts, xid, gid)


def _rollback_prepared(data: bytes) -> RollbackPrepared:
    flags, prep_end, rb_end, prep_ts, rb_ts, xid = _fixed(data, 1, _RBPREP, _RBPREP_L, "r")
    if flags:
        _fail("r", 1, f"unknown flags {flags}")
    gid, pos = _string(data, 1 + _RBPREP.size, "gid", "r")
    _check_end(data, pos, "r")
    return RollbackPrepared(flags, Lsn(prep_end), Lsn(rb_end), prep_ts, rb_ts, xid, gid)


_RowBody = Callable[[bytes, int, "int | None"], PgOutputMessage]


def _with_xid(body: _RowBody, tag: str) -> _Handler:
    """Inside a stream block these messages start with the streamed transaction's xid."""

    def handler(data: bytes) -> PgOutputMessage:
        if len(data) < 5:
            _need(data, 1, (("xid", 4),), tag)
        return body(data, 5, _U32.unpack_from(data, 1)[0])

    return handler


_ROW_BODIES: dict[str, _RowBody] = {
    "R": _relation,
    "Y": _type,
    "I": _insert,
    "U": _update,
    "D": _delete,
    "T": _truncate,
    "M": _message,
}

#: The tags whose in-stream messages ``defer_streamed`` keeps as bytes: the changes,
#: the schema they see, and logical messages (a captured DDL statement runs at the
#: transaction's replay, in its place among the changes).
DEFERRED_TAGS = "RYIUDTM"
_STREAMED_BODIES: dict[int, _Handler] = {
    ord(tag): _with_xid(_ROW_BODIES[tag], tag) for tag in DEFERRED_TAGS
}


def _defer(tag: str) -> _Handler:
    def handler(data: bytes) -> StreamedChange:
        if len(data) < 5:
            _need(data, 1, (("xid", 4),), tag)
        return _new_streamed(_unpack_u32(data, 1)[0], data)

    return handler


def decode_insert(data: bytes) -> Insert:
    """Decode the bytes of an Insert outside a stream block (an InsertRun's)."""
    if not data or data[0] != 73:  # 'I'
        raise DecodeError("not an Insert", offset=0)
    return _decode_insert(data)


def decode_streamed(data: bytes) -> PgOutputMessage:
    """Decode the bytes of a :class:`StreamedChange` (as inside its stream block)."""
    handler = _STREAMED_BODIES.get(data[0]) if data else None
    if handler is None:
        raise DecodeError("not a deferred streamed change", offset=0)
    return handler(data)


_PLAIN: dict[str, _Handler] = {
    "B": _begin,
    "C": _commit,
    "O": _origin,
    "R": _relation,
    "Y": _type,
    "I": _insert,
    "U": _update,
    "D": _delete,
    "T": _truncate,
    "M": _message,
    "c": _stream_commit,
    "b": _begin_prepare,
    "P": _prepare,
    "K": _commit_prepared,
    "r": _rollback_prepared,
    "p": _stream_prepare,
}

# In C when built (applier/speedups/decoder.c): six of a pgbench transaction's
# messages cost ~4.4 us in Python. What C does not decode it hands to these
# twins, which word the errors; in pure Python they are the decoders.
_ROW_DECODERS = row_decoders(
    (Begin, Commit, Insert, Update, Delete, TupleData, Lsn),
    (_begin, _commit, _insert, _update, _delete),
)
_PLAIN.update(_ROW_DECODERS)
_decode_insert: Callable[[bytes], Insert] = _ROW_DECODERS["I"]


def _unknown(data: bytes) -> NoReturn:
    byte = data[0]
    tag = chr(byte) if 0x20 < byte < 0x7F else f"0x{byte:02x}"
    raise DecodeError(f"unknown message type {tag!r}", msg_type=tag, offset=0)


def _refuse(tag: str, why: str) -> _Handler:
    def handler(data: bytes) -> NoReturn:
        _fail(tag, 0, why)

    return handler


class PgOutputDecoder:
    """Decode pgoutput messages of one replication connection, in order.

    ``proto_version`` is the negotiated ``proto_version`` option (1-4).
    ``streaming_parallel`` says whether streaming=parallel was requested, which
    makes protocol 4 Stream Abort carry abort_lsn/abort_ts; ``None`` accepts
    both forms at protocol 4 and tells them apart by length.
    """

    __slots__ = (
        "_in_stream",
        "_plain",
        "_stream",
        "defer_streamed",
        "handlers",
        "proto_version",
        "streaming_parallel",
    )

    def __init__(
        self,
        proto_version: int = 1,
        *,
        streaming_parallel: bool | None = None,
        defer_streamed: bool = False,
    ) -> None:
        if proto_version not in (1, 2, 3, 4):
            raise ValueError(f"unsupported pgoutput proto_version {proto_version}")
        self.proto_version = proto_version
        self.streaming_parallel = streaming_parallel
        #: Return in-stream changes as :class:`StreamedChange` (checked at replay).
        self.defer_streamed = defer_streamed
        self._plain = self._build_table(in_stream=False)
        self._stream = self._build_table(in_stream=True)
        #: The handler of each message by its tag byte: what :meth:`decode` calls,
        #: and the read loops (applier.speedups.take_xlog) index per message. One
        #: list for the decoder's life, rewritten in place on Stream Start and
        #: Stop, so a loop given it once sees each switch (256 pointers copied
        #: per stream block).
        self.handlers: list[_Handler] = list(self._plain)
        self._in_stream = False

    @property
    def in_stream(self) -> bool:
        """True between a Stream Start and its Stream Stop."""
        return self._in_stream

    def reset(self) -> None:
        """Forget stream state, e.g. after reconnecting."""
        self._switch(in_stream=False)

    def _switch(self, *, in_stream: bool) -> None:
        self.handlers[:] = self._stream if in_stream else self._plain
        self._in_stream = in_stream

    def decode(self, data: bytes | memoryview | bytearray) -> PgOutputMessage:
        """Decode one message; raise :class:`DecodeError` if the bytes are not one."""
        if type(data) is not bytes:
            data = bytes(data)
        try:
            handler = self.handlers[data[0]]
        except IndexError:
            raise DecodeError("empty message", offset=0) from None
        return handler(data)

    # Stream state -----------------------------------------------------------------

    def _stream_start(self, data: bytes) -> StreamStart:
        xid, first = _fixed_whole(data, _SSTART, _SSTART_L, "S")
        _flag(first, (0, 1), "first_segment", 5, "S")
        self._switch(in_stream=True)
        return _new_stream_start(xid, bool(first))

    def _stream_stop(self, data: bytes) -> StreamStop:
        _check_end(data, 1, "E")
        self._switch(in_stream=False)
        return StreamStop()

    def _stream_abort(self, data: bytes) -> StreamAbort:
        parallel = self.streaming_parallel if self.proto_version >= 4 else False
        if parallel is None:
            parallel = len(data) > 1 + _SABORT.size
        if not parallel:
            xid, subxid = _fixed_whole(data, _SABORT, _SABORT_L, "A")
            return StreamAbort(xid, subxid, None, None)
        xid, subxid, lsn, ts = _fixed_whole(data, _SABORT4, _SABORT4_L, "A")
        return StreamAbort(xid, subxid, Lsn(lsn), ts)

    def _build_table(self, *, in_stream: bool) -> list[_Handler]:
        handlers: dict[str, _Handler] = dict(_PLAIN)
        handlers.update(S=self._stream_start, E=self._stream_stop, A=self._stream_abort)
        if in_stream:
            for tag, body in _ROW_BODIES.items():
                defer = self.defer_streamed and tag in DEFERRED_TAGS
                handlers[tag] = _defer(tag) if defer else _with_xid(body, tag)
            handlers["S"] = _refuse("S", "Stream Start inside a stream block")
            for tag in "cAp":
                handlers[tag] = _refuse(tag, "not allowed inside a stream block")
        else:
            handlers["E"] = _refuse("E", "Stream Stop outside a stream block")
        for tag, version in MIN_PROTO_VERSION.items():
            if self.proto_version < version:
                why = f"needs protocol version {version}, negotiated {self.proto_version}"
                handlers[tag] = _refuse(tag, why)
        table: list[_Handler] = [_unknown] * 256
        for tag, handler in handlers.items():
            table[ord(tag)] = handler
        return table
