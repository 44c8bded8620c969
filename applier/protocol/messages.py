"""Typed pgoutput messages, one frozen slotted dataclass per message kind.

Names and fields follow PostgreSQL's "Logical Replication Message Formats"
chapter. Timestamps stay ``int`` microseconds since the PostgreSQL epoch
(2000-01-01 UTC) because most of them are only ever compared or stored; the
``*_time`` properties turn them into datetimes when someone wants to look.

:class:`TupleData` is deliberately flat: one ``kinds`` byte string (one byte per
column) and one tuple of ``bytes | None`` values, so the apply engine can pass
values straight on as query parameters without any per-column object.

The decoder builds instances through :func:`fast_constructor`, which skips
``__init__`` (and so ``__post_init__`` validation) because the decoder has
already checked the bytes; validation in ``__post_init__`` guards objects that
code builds by hand, e.g. for the encoder.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, TypeVar

from applier.lsn import Lsn, pg_timestamp

__all__ = [
    "ALL_MESSAGE_TYPES",
    "BINARY",
    "NULL",
    "REPLICA_IDENTITIES",
    "TEXT",
    "TRUNCATE_CASCADE",
    "TRUNCATE_RESTART_IDENTITY",
    "UNCHANGED_TOAST",
    "Begin",
    "BeginPrepare",
    "Column",
    "Commit",
    "CommitPrepared",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "PgOutputMessage",
    "Prepare",
    "Relation",
    "RollbackPrepared",
    "StreamAbort",
    "StreamCommit",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleData",
    "Type",
    "Update",
    "fast_constructor",
]

# TupleData column kinds, as the integers ``kinds[i]`` yields.
NULL = ord("n")
UNCHANGED_TOAST = ord("u")
TEXT = ord("t")
BINARY = ord("b")
_KINDS = frozenset((NULL, UNCHANGED_TOAST, TEXT, BINARY))

TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2

#: relreplident values: default, nothing, full, index.
REPLICA_IDENTITIES = frozenset("dnfi")

OldKind = Literal["K", "O"]


@dataclass(frozen=True, slots=True)
class TupleData:
    """Column values of one row: ``kinds[i]`` says how to read ``values[i]``.

    ``values[i]`` is ``bytes`` for TEXT and BINARY columns and ``None`` for
    NULL and UNCHANGED_TOAST; ``kinds`` tells those two apart.
    """

    kinds: bytes
    values: tuple[bytes | None, ...]

    def __post_init__(self) -> None:
        if len(self.kinds) != len(self.values):
            raise ValueError("TupleData: kinds and values differ in length")
        for kind, value in zip(self.kinds, self.values, strict=True):
            if kind not in _KINDS:
                raise ValueError(f"TupleData: unknown column kind {kind!r}")
            if (value is None) != (kind in (NULL, UNCHANGED_TOAST)):
                raise ValueError(f"TupleData: value {value!r} does not fit kind {chr(kind)!r}")

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[tuple[int, bytes | None]]:
        """Yield ``(kind, value)`` per column; ``kind`` is one of the module constants."""
        return zip(self.kinds, self.values, strict=True)

    @property
    def has_unchanged_toast(self) -> bool:
        """True if some column is an unchanged TOAST value that was not sent."""
        return UNCHANGED_TOAST in self.kinds

    @property
    def has_binary(self) -> bool:
        return BINARY in self.kinds

    def unchanged_toast_columns(self) -> tuple[int, ...]:
        """Indexes of the columns whose value was not sent (keep the target's)."""
        return tuple(i for i, k in enumerate(self.kinds) if k == UNCHANGED_TOAST)

    @classmethod
    def text(cls, *values: bytes | None) -> TupleData:
        """Build a text-format tuple; ``None`` becomes NULL (handy in tests)."""
        kinds = bytes(NULL if v is None else TEXT for v in values)
        return cls(kinds, tuple(values))


@dataclass(frozen=True, slots=True)
class Column:
    flags: int
    name: str
    type_oid: int
    atttypmod: int

    @property
    def is_key(self) -> bool:
        """Part of the replica identity (flag bit 1)."""
        return bool(self.flags & 1)


def _check_xid(xid: int | None) -> None:
    if xid is not None and not 0 <= xid <= 0xFFFFFFFF:
        raise ValueError(f"xid {xid} out of range")


@dataclass(frozen=True, slots=True)
class Begin:
    kind: ClassVar[str] = "begin"
    tag: ClassVar[str] = "B"
    final_lsn: Lsn
    commit_ts: int
    xid: int

    @property
    def commit_time(self) -> _dt.datetime:
        return pg_timestamp(self.commit_ts)


@dataclass(frozen=True, slots=True)
class Commit:
    kind: ClassVar[str] = "commit"
    tag: ClassVar[str] = "C"
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: int

    @property
    def commit_time(self) -> _dt.datetime:
        return pg_timestamp(self.commit_ts)


@dataclass(frozen=True, slots=True)
class Origin:
    kind: ClassVar[str] = "origin"
    tag: ClassVar[str] = "O"
    origin_lsn: Lsn
    name: str


@dataclass(frozen=True, slots=True)
class Relation:
    kind: ClassVar[str] = "relation"
    tag: ClassVar[str] = "R"
    xid: int | None
    oid: int
    namespace: str
    name: str
    replident: str
    columns: tuple[Column, ...]

    def __post_init__(self) -> None:
        _check_xid(self.xid)
        if self.replident not in REPLICA_IDENTITIES:
            raise ValueError(f"Relation: unknown replica identity {self.replident!r}")

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.is_key)


@dataclass(frozen=True, slots=True)
class Type:
    kind: ClassVar[str] = "type"
    tag: ClassVar[str] = "Y"
    xid: int | None
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    kind: ClassVar[str] = "insert"
    tag: ClassVar[str] = "I"
    xid: int | None
    relation_oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """``old`` is the key ('K') or the whole old row ('O'), or absent."""

    kind: ClassVar[str] = "update"
    tag: ClassVar[str] = "U"
    xid: int | None
    relation_oid: int
    old: TupleData | None
    old_kind: OldKind | None
    new: TupleData

    def __post_init__(self) -> None:
        if (self.old is None) != (self.old_kind is None) or self.old_kind not in (None, "K", "O"):
            raise ValueError("Update: old and old_kind must be both absent or both set")


@dataclass(frozen=True, slots=True)
class Delete:
    kind: ClassVar[str] = "delete"
    tag: ClassVar[str] = "D"
    xid: int | None
    relation_oid: int
    old: TupleData
    old_kind: OldKind

    def __post_init__(self) -> None:
        if self.old_kind not in ("K", "O"):
            raise ValueError(f"Delete: old_kind must be 'K' or 'O', not {self.old_kind!r}")


@dataclass(frozen=True, slots=True)
class Truncate:
    kind: ClassVar[str] = "truncate"
    tag: ClassVar[str] = "T"
    xid: int | None
    options: int
    relation_oids: tuple[int, ...]

    @property
    def cascade(self) -> bool:
        return bool(self.options & TRUNCATE_CASCADE)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & TRUNCATE_RESTART_IDENTITY)


@dataclass(frozen=True, slots=True)
class Message:
    """A logical decoding message (``pg_logical_emit_message``)."""

    kind: ClassVar[str] = "message"
    tag: ClassVar[str] = "M"
    xid: int | None
    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    kind: ClassVar[str] = "stream_start"
    tag: ClassVar[str] = "S"
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    kind: ClassVar[str] = "stream_stop"
    tag: ClassVar[str] = "E"


@dataclass(frozen=True, slots=True)
class StreamCommit:
    kind: ClassVar[str] = "stream_commit"
    tag: ClassVar[str] = "c"
    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: int

    @property
    def commit_time(self) -> _dt.datetime:
        return pg_timestamp(self.commit_ts)


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """``abort_lsn``/``abort_ts`` are sent only with protocol 4 and streaming=parallel."""

    kind: ClassVar[str] = "stream_abort"
    tag: ClassVar[str] = "A"
    xid: int
    subxid: int
    abort_lsn: Lsn | None = None
    abort_ts: int | None = None

    def __post_init__(self) -> None:
        if (self.abort_lsn is None) != (self.abort_ts is None):
            raise ValueError("StreamAbort: abort_lsn and abort_ts go together")

    @property
    def abort_time(self) -> _dt.datetime | None:
        return None if self.abort_ts is None else pg_timestamp(self.abort_ts)


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    kind: ClassVar[str] = "begin_prepare"
    tag: ClassVar[str] = "b"
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts: int
    xid: int
    gid: str

    @property
    def prepare_time(self) -> _dt.datetime:
        return pg_timestamp(self.prepare_ts)


@dataclass(frozen=True, slots=True)
class Prepare:
    kind: ClassVar[str] = "prepare"
    tag: ClassVar[str] = "P"
    flags: int
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts: int
    xid: int
    gid: str

    @property
    def prepare_time(self) -> _dt.datetime:
        return pg_timestamp(self.prepare_ts)


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    kind: ClassVar[str] = "commit_prepared"
    tag: ClassVar[str] = "K"
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: int
    xid: int
    gid: str

    @property
    def commit_time(self) -> _dt.datetime:
        return pg_timestamp(self.commit_ts)


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    kind: ClassVar[str] = "rollback_prepared"
    tag: ClassVar[str] = "r"
    flags: int
    prepare_end_lsn: Lsn
    rollback_end_lsn: Lsn
    prepare_ts: int
    rollback_ts: int
    xid: int
    gid: str

    @property
    def prepare_time(self) -> _dt.datetime:
        return pg_timestamp(self.prepare_ts)

    @property
    def rollback_time(self) -> _dt.datetime:
        return pg_timestamp(self.rollback_ts)


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    kind: ClassVar[str] = "stream_prepare"
    tag: ClassVar[str] = "p"
    flags: int
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts: int
    xid: int
    gid: str

    @property
    def prepare_time(self) -> _dt.datetime:
        return pg_timestamp(self.prepare_ts)


@dataclass(frozen=True, slots=True)
class StreamedChange:
    """A Relation/Type/Insert/Update/Delete/Truncate inside a stream block, undecoded.

    Only from ``PgOutputDecoder(defer_streamed=True)``: a streamed change is not
    applied before its Stream Commit, so the apply worker keeps the bytes (which
    are compact and need no serialisation to spool) and decodes them at replay
    with :func:`applier.protocol.decoder.decode_streamed`. ``data`` is the whole
    message, tag and xid included.
    """

    kind: ClassVar[str] = "streamed_change"
    xid: int
    data: bytes

    @property
    def tag(self) -> str:
        return chr(self.data[0])


@dataclass(slots=True)
class StreamedRun:
    """Consecutive streamed changes that start with the same bytes, undecoded.

    The first 10 bytes of a streamed Insert, Update or Delete are its tag, xid,
    relation and the kind of its first tuple: a run of them is a run of row
    changes of one kind, table and (sub)transaction, which the stream client
    hands over as one item when asked to (``group_streamed``; the C read loop
    only) so that the apply worker can take it in one step. Each element of
    ``datas`` is what a :class:`StreamedChange` would hold; ``lsns`` are their
    WAL positions, as ints. Mutable: the read loop appends to the lists. Not a
    :data:`PgOutputMessage`: it stands for several.
    """

    kind: ClassVar[str] = "streamed_run"
    xid: int
    datas: list[bytes]
    lsns: list[int]


@dataclass(slots=True)
class InsertRun:
    """Consecutive Inserts into one relation outside stream blocks (``group_streamed``).

    ``first`` is the first, decoded (its WAL position is the item's); ``datas``
    are the bytes of the Inserts after it (``'I' relid 'N'`` + TupleData),
    undecoded, and ``lsns`` their WAL positions, as ints. Not a
    :data:`PgOutputMessage`: it stands for several.
    """

    kind: ClassVar[str] = "insert_run"
    first: Insert
    datas: list[bytes]
    lsns: list[int]


PgOutputMessage = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | Message
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
    | StreamedChange
)

#: Every message class, in the order of the protocol chapter.
ALL_MESSAGE_TYPES: tuple[type[PgOutputMessage], ...] = (
    Begin,
    Commit,
    Origin,
    Relation,
    Type,
    Insert,
    Update,
    Delete,
    Truncate,
    Message,
    StreamStart,
    StreamStop,
    StreamCommit,
    StreamAbort,
    BeginPrepare,
    Prepare,
    CommitPrepared,
    RollbackPrepared,
    StreamPrepare,
)

_T = TypeVar("_T")


def fast_constructor(cls: type[_T]) -> Callable[..., _T]:
    """A positional constructor for a frozen slotted dataclass that skips ``__init__``.

    Frozen dataclasses set each field through ``object.__setattr__``, which
    costs about 1.5x more than setting the slots directly; the decoder builds
    millions of these, and it has validated the bytes already.
    """
    setters = tuple(cls.__dict__[f.name].__set__ for f in fields(cls))  # type: ignore[arg-type]
    new = object.__new__
    src = ", ".join(f"a{i}" for i in range(len(setters)))
    body = "".join(f"    s{i}(o, a{i})\n" for i in range(len(setters)))
    code = f"def build({src}):\n    o = new(cls)\n{body}    return o\n"
    env: dict[str, Any] = {"new": new, "cls": cls}
    env.update({f"s{i}": s for i, s in enumerate(setters)})
    exec(code, env)  # generated from field names only, as dataclasses does
    built: Callable[..., _T] = env["build"]
    return built
