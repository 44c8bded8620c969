"""The pgoutput protocol core: bytes in, typed messages out, no I/O.

* :mod:`.messages` - one frozen dataclass per message kind, flat :class:`TupleData`.
* :mod:`.decoder` - :class:`PgOutputDecoder`, the fast, strict bytes -> message path.
* :mod:`.tuples` - the TupleData reader of the row messages (C or its Python twin).
* :mod:`.malformed` - the DecodeError wording both of them use.
* :mod:`.copydata` - the streaming replication CopyData frames (``w``, ``k``, ``r``).
* :mod:`.encoder` - message -> bytes, the decoder's inverse, for tests and benchmarks.

Nothing here touches a socket or a database; the stream layer feeds bytes in.
Malformed input always raises :class:`applier.errors.DecodeError` with the
message tag and byte offset.
"""

from .copydata import (
    Keepalive,
    XLogData,
    keepalive,
    parse_copydata,
    standby_status_update,
    xlogdata,
)
from .decoder import (
    MESSAGE_NAMES,
    MIN_PROTO_VERSION,
    PgOutputDecoder,
    decode_insert,
    decode_streamed,
)
from .encoder import encode, encode_tuple
from .messages import (
    ALL_MESSAGE_TYPES,
    BINARY,
    NULL,
    TEXT,
    TRUNCATE_CASCADE,
    TRUNCATE_RESTART_IDENTITY,
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    InsertRun,
    Message,
    Origin,
    PgOutputMessage,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamedChange,
    StreamedRun,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
)
from .tuples import read_tuple

__all__ = [
    "ALL_MESSAGE_TYPES",
    "BINARY",
    "MESSAGE_NAMES",
    "MIN_PROTO_VERSION",
    "NULL",
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
    "InsertRun",
    "Keepalive",
    "Message",
    "Origin",
    "PgOutputDecoder",
    "PgOutputMessage",
    "Prepare",
    "Relation",
    "RollbackPrepared",
    "StreamAbort",
    "StreamCommit",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "StreamedChange",
    "StreamedRun",
    "Truncate",
    "TupleData",
    "Type",
    "Update",
    "XLogData",
    "decode_insert",
    "decode_streamed",
    "encode",
    "encode_tuple",
    "keepalive",
    "parse_copydata",
    "read_tuple",
    "standby_status_update",
    "xlogdata",
]
