"""pgoutput encoder: the exact inverse of :mod:`applier.protocol.decoder`.

The applier never sends pgoutput; this exists so tests, fuzzers and benchmarks
can build streams byte-for-byte the way a walsender would. It is strict about
what the negotiated protocol allows, so a test cannot build a stream the server
could never send: stream messages need version 2, two-phase messages 3, the
Stream Abort LSN/timestamp 4, and the xid prefix appears exactly when
``in_stream`` is true.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from typing import Any

from .copydata import keepalive, xlogdata
from .decoder import MIN_PROTO_VERSION
from .messages import (
    Begin,
    BeginPrepare,
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
)

__all__ = ["encode", "encode_tuple", "keepalive", "xlogdata"]

_U32 = Struct(">I")
_LEN = Struct(">i")
_U16 = Struct(">H")
_XID_TAGS = frozenset("RYIUDTM")


def _cstr(text: str) -> bytes:
    raw = text.encode("utf-8")
    if b"\0" in raw:
        raise ValueError(f"string {text!r} contains NUL")
    return raw + b"\0"


def encode_tuple(tup: TupleData) -> bytes:
    """TupleData: Int16 ncols, then per column a kind byte and, for t/b, Int32 length + bytes."""
    parts = [_U16.pack(len(tup.values))]
    for kind, value in zip(tup.kinds, tup.values, strict=True):
        parts.append(bytes((kind,)))
        if value is not None:
            parts.append(_LEN.pack(len(value)))
            parts.append(value)
    return b"".join(parts)


def _begin(m: Begin) -> bytes:
    return Struct(">QqI").pack(m.final_lsn, m.commit_ts, m.xid)


def _commit(m: Commit) -> bytes:
    return Struct(">BQQq").pack(m.flags, m.commit_lsn, m.end_lsn, m.commit_ts)


def _origin(m: Origin) -> bytes:
    return Struct(">Q").pack(m.origin_lsn) + _cstr(m.name)


def _relation(m: Relation) -> bytes:
    parts = [_U32.pack(m.oid), _cstr(m.namespace), _cstr(m.name)]
    parts.append(Struct(">BH").pack(ord(m.replident), len(m.columns)))
    for col in m.columns:
        parts += [
            bytes((col.flags,)),
            _cstr(col.name),
            Struct(">Ii").pack(col.type_oid, col.atttypmod),
        ]
    return b"".join(parts)


def _type(m: Type) -> bytes:
    return _U32.pack(m.oid) + _cstr(m.namespace) + _cstr(m.name)


def _insert(m: Insert) -> bytes:
    return _U32.pack(m.relation_oid) + b"N" + encode_tuple(m.new)


def _update(m: Update) -> bytes:
    old = b"" if m.old is None else str(m.old_kind).encode() + encode_tuple(m.old)
    return _U32.pack(m.relation_oid) + old + b"N" + encode_tuple(m.new)


def _delete(m: Delete) -> bytes:
    return _U32.pack(m.relation_oid) + m.old_kind.encode() + encode_tuple(m.old)


def _truncate(m: Truncate) -> bytes:
    n = len(m.relation_oids)
    return Struct(f">IB{n}I").pack(n, m.options, *m.relation_oids)


def _message(m: Message) -> bytes:
    head = Struct(">BQ").pack(int(m.transactional), m.lsn) + _cstr(m.prefix)
    return head + _U32.pack(len(m.content)) + m.content


def _stream_start(m: StreamStart) -> bytes:
    return Struct(">IB").pack(m.xid, int(m.first_segment))


def _stream_stop(m: StreamStop) -> bytes:
    return b""


def _stream_commit(m: StreamCommit) -> bytes:
    return Struct(">IBQQq").pack(m.xid, m.flags, m.commit_lsn, m.end_lsn, m.commit_ts)


def _stream_abort(m: StreamAbort) -> bytes:
    if m.abort_lsn is None or m.abort_ts is None:
        return Struct(">II").pack(m.xid, m.subxid)
    return Struct(">IIQq").pack(m.xid, m.subxid, m.abort_lsn, m.abort_ts)


def _begin_prepare(m: BeginPrepare) -> bytes:
    return Struct(">QQqI").pack(m.prepare_lsn, m.end_lsn, m.prepare_ts, m.xid) + _cstr(m.gid)


def _prepare(m: Prepare | StreamPrepare) -> bytes:
    head = Struct(">BQQqI").pack(m.flags, m.prepare_lsn, m.end_lsn, m.prepare_ts, m.xid)
    return head + _cstr(m.gid)


def _commit_prepared(m: CommitPrepared) -> bytes:
    head = Struct(">BQQqI").pack(m.flags, m.commit_lsn, m.end_lsn, m.commit_ts, m.xid)
    return head + _cstr(m.gid)


def _rollback_prepared(m: RollbackPrepared) -> bytes:
    st = Struct(">BQQqqI")
    head = st.pack(
        m.flags, m.prepare_end_lsn, m.rollback_end_lsn, m.prepare_ts, m.rollback_ts, m.xid
    )
    return head + _cstr(m.gid)


_BODIES: dict[type[Any], Callable[[Any], bytes]] = {
    Begin: _begin,
    Commit: _commit,
    Origin: _origin,
    Relation: _relation,
    Type: _type,
    Insert: _insert,
    Update: _update,
    Delete: _delete,
    Truncate: _truncate,
    Message: _message,
    StreamStart: _stream_start,
    StreamStop: _stream_stop,
    StreamCommit: _stream_commit,
    StreamAbort: _stream_abort,
    BeginPrepare: _begin_prepare,
    Prepare: _prepare,
    CommitPrepared: _commit_prepared,
    RollbackPrepared: _rollback_prepared,
    StreamPrepare: _prepare,
}


def _check_allowed(msg: PgOutputMessage, proto_version: int, in_stream: bool) -> None:
    tag = msg.tag
    need = MIN_PROTO_VERSION.get(tag, 1)
    if proto_version < need:
        raise ValueError(f"{type(msg).__name__} needs protocol version {need}")
    if isinstance(msg, StreamAbort) and msg.abort_lsn is not None and proto_version < 4:
        raise ValueError("StreamAbort abort_lsn/abort_ts need protocol version 4")
    if tag in _XID_TAGS:
        xid = getattr(msg, "xid", None)
        if in_stream != (xid is not None):
            raise ValueError(f"{type(msg).__name__}: xid must be set exactly inside a stream block")


def encode(msg: PgOutputMessage, proto_version: int = 1, in_stream: bool = False) -> bytes:
    """The bytes a walsender would send for ``msg``; raise ValueError if it could not."""
    if isinstance(msg, StreamedChange):
        return msg.data  # still the bytes it was received as
    _check_allowed(msg, proto_version, in_stream)
    head = msg.tag.encode()
    xid = getattr(msg, "xid", None) if msg.tag in _XID_TAGS else None
    if xid is not None:
        head += _U32.pack(xid)
    return head + _BODIES[type(msg)](msg)
