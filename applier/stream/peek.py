"""Peek at a slot: print its decoded change stream, one message per line (``applier decode``).

The command line is :mod:`applier.cli.decode`; this module reads the slot and
formats its messages.

A debugging and inspection tool, so it must never change what it inspects:
the stream runs with ``report_flush=False`` (flush/apply reported as 0/0,
which the walsender ignores), so the slot's ``confirmed_flush_lsn`` never
moves and ``applier run`` later sees exactly the same changes.

It requests what ``applier run`` would: the highest proto_version, streaming
"on" when ``apply.streaming`` is not "off" (parallel streaming only changes
how the worker applies, not what is worth printing), binary as configured,
and logical decoding messages. two_phase is the exception: asking for it
on a slot created without it switches two-phase decoding on *for the slot*,
for good (the walsender persists ``two_phase``), so it is requested only
when the slot has it already (``pg_replication_slots.two_phase``); otherwise
prepared transactions show at COMMIT PREPARED as ordinary transactions,
which is what this slot really streams, and a note says so.

Output (``--format json``): one JSON object per message with ``lsn`` (the
XLogData start, ``X/Y``), ``type`` (the message kind) and ``xid`` (the
transaction's xid, tracked from Begin/Begin Prepare/Stream Start for the
messages inside it; null where there is none; inside a stream block a
subtransaction's change adds ``subxid``), plus the kind's fields; see
:class:`MessageFormatter`. ``--format text`` prints one readable line per
message, e.g. ``0/16B3748 xid=735 INSERT public.t id=1 v='hello'``.

Stopping: with ``--end`` the command exits 0 once the stream reaches that LSN
(a message or keepalive at or past it; messages past it are not printed, as
with ``pg_recvlogical --endpos``); without it, on SIGINT/SIGTERM (exit 0).
An ``--end`` past the source's current WAL position (IDENTIFY_SYSTEM's) is
waited for, and said so on stderr: one line at start with both positions,
then one every ``WAIT_SAY_EVERY`` s.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from types import FrameType
from typing import Any, TextIO

from applier.config import Config
from applier.errors import ProtocolError, SlotMissing
from applier.lsn import Lsn, pg_timestamp
from applier.protocol import (
    BINARY,
    NULL,
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Delete,
    Insert,
    InsertRun,
    Message,
    PgOutputMessage,
    Relation,
    StreamedRun,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Update,
)
from applier.refusal import check_publications
from applier.stream.client import LogicalStream, StreamOptions
from applier.stream.replconn import CREATE_HINT, ReplicationConnection

__all__ = ["MessageFormatter", "run_decode"]

log = logging.getLogger("applier.stream")

#: How long one read waits, so a signal is noticed within this many seconds.
POLL_SECONDS = 0.5
#: While waiting for an ``--end`` past the source's position, a progress line this often.
WAIT_SAY_EVERY = 10.0

# Types printed unquoted in the text format.
_NUMERIC_OIDS = frozenset({16, 20, 21, 23, 26, 700, 701, 1700})

# Messages that open a transaction context; the xid of the messages inside comes from them.
_OPENERS = (Begin, BeginPrepare)
# Message kinds after which there is no current transaction any more.
_CLOSERS = frozenset({"commit", "prepare"})

Row = dict[str, Any]


def run_decode(
    cfg: Config,
    *,
    slot: str | None,
    fmt: str,
    start: Lsn | None,
    end: Lsn | None,
    out: TextIO = sys.stdout,
) -> int:
    """Stream the slot and print every message until ``end`` or a signal; return 0."""
    slot = slot or cfg.source.slot
    conn = ReplicationConnection.open(cfg.source.conninfo(), application_name="applier-decode")
    try:
        two_phase = _slot_two_phase(conn, slot, cfg.apply.two_phase)
        check_publications(cfg.source.publications, conn.publications())
        source_at = conn.identify_system().xlogpos
    except BaseException:
        conn.close()
        raise
    options = StreamOptions(
        slot=slot,
        publications=cfg.source.publications,
        start_lsn=Lsn(start or 0),
        binary=cfg.apply.binary,
        messages=True,
        streaming="on" if cfg.apply.streaming != "off" else "off",
        two_phase=two_phase,
        status_interval=cfg.apply.status_interval,
        timeout=cfg.apply.timeout,
        report_flush=False,  # never advance the slot
    )
    formatter = MessageFormatter()
    write = formatter.json_line if fmt == "json" else formatter.text_line
    stream = LogicalStream(conn, options)
    try:
        stream.start()
        waiting = _Waiting(end, source_at)
        with _stop_on_signals() as stopping:
            _pump(stream, write, out, end, stopping, waiting)
    except BrokenPipeError:  # `applier decode | head`: the reader has gone, not an error
        pass
    finally:
        stream.stop()
    return 0


def _slot_two_phase(conn: ReplicationConnection, slot: str, wanted: bool) -> bool:
    """Whether to ask for two_phase: only if the slot has it, so the slot never changes."""
    state = conn.slot_state(slot)
    if state is None:
        raise SlotMissing(f"replication slot {slot!r} does not exist", hint=CREATE_HINT, slot=slot)
    if wanted and not state.two_phase:
        log.warning(
            "the slot was created without two-phase: prepared transactions are shown at "
            "COMMIT PREPARED (decode never switches two-phase on for a slot)",
            extra={"ctx": {"slot": slot}},
        )
    return state.two_phase


def _pump(
    stream: LogicalStream,
    write: Callable[[Lsn, PgOutputMessage], str],
    out: TextIO,
    end: Lsn | None,
    stopping: threading.Event,
    waiting: _Waiting,
) -> None:
    while not stopping.is_set():
        batch = stream.read(POLL_SECONDS)
        waiting.progress(stream.last_received)
        lines = []
        for lsn, msg in batch:
            if end is not None and lsn > end:
                break
            assert not isinstance(msg, (StreamedRun, InsertRun))  # it does not group_streamed
            lines.append(write(lsn, msg))
        if lines:
            out.write("\n".join(lines) + "\n")
            out.flush()
        if end is not None and (stream.last_received >= end or any(lsn >= end for lsn, _ in batch)):
            return


class _Waiting:
    """Says so when ``--end`` lies past the source's WAL position: the command then waits
    for WAL that may be long in coming (an idle source writes little), and silence
    looked like a hang. One line at start, one every :data:`WAIT_SAY_EVERY` s after."""

    def __init__(self, end: Lsn | None, source_at: Lsn) -> None:
        self.end = end
        self.active = end is not None and end > source_at
        self._said = time.monotonic()
        if self.active:
            log.warning(
                f"waiting for the source to reach {end} (it is at {source_at} now): decode "
                "exits there; the source writes WAL only as it changes. Ctrl-C stops it"
            )

    def progress(self, received: Lsn) -> None:
        if not self.active or self.end is None:
            return
        if received >= self.end:
            self.active = False
        elif time.monotonic() - self._said >= WAIT_SAY_EVERY:
            self._said = time.monotonic()
            log.warning(
                f"still waiting for the source to reach {self.end} (received up to {received})"
            )


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """SIGINT/SIGTERM set an event instead of raising, so we stop between batches."""
    stopping = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stopping
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopping
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class MessageFormatter:
    """Turns messages into JSON objects or text lines; keeps the Relation cache and current xid."""

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}
        self._xid: int | None = None  # of the Begin / Begin Prepare we are inside
        self._stream_xid: int | None = None  # of the Stream Start we are inside

    # -- public ---------------------------------------------------------------------

    def to_dict(self, lsn: Lsn, msg: PgOutputMessage) -> Row:
        """The JSON object for one message (and update the xid/relation state)."""
        xid = self._track_xid(msg)
        obj: Row = {"lsn": str(lsn), "type": msg.kind, "xid": xid}
        own = getattr(msg, "xid", None)
        if own is not None and own != xid:  # a subtransaction's change inside a stream block
            obj["subxid"] = own
        obj.update(self._fields(msg))
        if isinstance(msg, Relation):
            self.relations[msg.oid] = msg
        if msg.kind in _CLOSERS:
            self._xid = None
        if isinstance(msg, StreamStop):
            self._stream_xid = None
        return obj

    def json_line(self, lsn: Lsn, msg: PgOutputMessage) -> str:
        return json.dumps(self.to_dict(lsn, msg), ensure_ascii=False, separators=(",", ":"))

    def text_line(self, lsn: Lsn, msg: PgOutputMessage) -> str:
        obj = self.to_dict(lsn, msg)
        head = f"{obj.pop('lsn')} xid={_text_scalar(obj.pop('xid'))} {obj.pop('type').upper()}"
        rel = self.relations.get(getattr(msg, "relation_oid", -1))
        parts = [head]
        if "relation" in obj:
            parts.append(str(obj.pop("relation")))
        # Label the row sections only where there is more than one kind of row.
        labelled = "key" in obj or "old" in obj
        for section in ("key", "old", "new"):
            if section in obj:
                parts.append(_text_row(obj.pop(section), rel, section if labelled else ""))
        parts.extend(f"{k}={_text_scalar(v)}" for k, v in obj.items())
        return " ".join(p for p in parts if p)

    # -- xid tracking ----------------------------------------------------------------

    def _track_xid(self, msg: PgOutputMessage) -> int | None:
        if isinstance(msg, _OPENERS):
            self._xid = msg.xid
            return msg.xid
        if isinstance(msg, StreamStart):
            self._stream_xid = msg.xid
            return msg.xid
        if isinstance(msg, StreamStop):
            return self._stream_xid
        if self._stream_xid is not None:  # inside a stream block: the toplevel xid
            return self._stream_xid
        own = getattr(msg, "xid", None)
        if own is not None:  # commit_prepared, stream_commit, stream_abort...
            return int(own)
        if isinstance(msg, Message) and not msg.transactional:
            return None
        return self._xid

    # -- fields per kind ---------------------------------------------------------------

    def _fields(self, msg: PgOutputMessage) -> Row:
        if isinstance(msg, Insert | Update | Delete):
            return self._row_fields(msg)
        if isinstance(msg, Relation):
            return _relation_fields(msg)
        if isinstance(msg, Truncate):
            return {
                "cascade": msg.cascade,
                "restart_identity": msg.restart_identity,
                "relations": [self._relation(oid, msg).qualname for oid in msg.relation_oids],
            }
        if isinstance(msg, Message):
            return _message_fields(msg)
        return _generic_fields(msg)

    def _relation(self, oid: int, msg: PgOutputMessage) -> _Rel:
        rel = self.relations.get(oid)
        if rel is None:
            raise ProtocolError(
                f"{msg.kind} message for relation oid {oid}, which no Relation message announced",
                hint="the stream is out of order or started mid-transaction; report this",
            )
        return _Rel(rel)

    def _row_fields(self, msg: Insert | Update | Delete) -> Row:
        rel = self._relation(msg.relation_oid, msg)
        obj: Row = {"relation": rel.qualname}
        old = getattr(msg, "old", None)
        if old is not None:
            if msg.old_kind == "K":  # type: ignore[union-attr]
                obj["key"] = rel.row(old, keys_only=True)
            else:
                obj["old"] = rel.row(old)
        new = getattr(msg, "new", None)
        if new is not None:
            obj["new"] = rel.row(new)
        return obj


class _Rel:
    """A Relation seen through the formatter: its name and how to turn tuples into objects."""

    __slots__ = ("rel",)

    def __init__(self, rel: Relation) -> None:
        self.rel = rel

    @property
    def qualname(self) -> str:
        return f"{self.rel.namespace}.{self.rel.name}"

    def row(self, tup: TupleData, *, keys_only: bool = False) -> Row:
        cols = self.rel.columns
        if len(tup.kinds) != len(cols):
            raise ProtocolError(
                f"row of {self.qualname} has {len(tup.kinds)} columns, its Relation {len(cols)}"
            )
        return {
            c.name: _value(kind, value)
            for c, kind, value in zip(cols, tup.kinds, tup.values, strict=True)
            if not keys_only or c.is_key
        }


def _value(kind: int, value: bytes | None) -> Any:
    if kind == NULL:
        return None
    if kind == UNCHANGED_TOAST:
        return {"unchanged_toast": True}
    assert value is not None
    if kind == BINARY:
        return "\\x" + value.hex()
    return value.decode("utf-8", "replace")


def _relation_fields(msg: Relation) -> Row:
    return {
        "relation": f"{msg.namespace}.{msg.name}",
        "oid": msg.oid,
        "replident": msg.replident,
        "columns": [
            {"name": c.name, "type_oid": c.type_oid, "atttypmod": c.atttypmod, "key": c.is_key}
            for c in msg.columns
        ],
    }


def _message_fields(msg: Message) -> Row:
    try:
        content, encoding = msg.content.decode("utf-8"), "text"
    except UnicodeDecodeError:
        content, encoding = msg.content.hex(), "hex"
    return {
        "transactional": msg.transactional,
        "message_lsn": str(msg.lsn),
        "prefix": msg.prefix,
        "content": content,
        "content_encoding": encoding,
    }


def _generic_fields(msg: PgOutputMessage) -> Row:
    """Every field but xid: LSNs as text, ``*_ts`` as ``*_time`` ISO 8601 UTC, Origin's name."""
    obj: Row = {}
    for f in fields(msg):
        name, value = f.name, getattr(msg, f.name)
        if name == "xid":
            continue
        if name.endswith("_ts"):
            name = name[:-3] + "_time"
            value = None if value is None else _iso(value)
        elif isinstance(value, Lsn):
            value = str(value)
        elif name == "name" and msg.kind == "origin":
            name = "origin"
        obj[name] = value
    return obj


def _iso(ts_us: int) -> str:
    return pg_timestamp(ts_us).isoformat().replace("+00:00", "Z")


def _text_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str) and (not v or " " in v or "'" in v):
        return _quote(v)
    return str(v) if not isinstance(v, list | dict) else json.dumps(v, ensure_ascii=False)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _text_row(row: Row, rel: Relation | None, label: str) -> str:
    types = {c.name: c.type_oid for c in rel.columns} if rel else {}
    cells = []
    for name, v in row.items():
        if v is None:
            shown = "null"
        elif isinstance(v, dict):
            shown = "(unchanged-toast)"
        elif types.get(name) in _NUMERIC_OIDS:
            shown = str(v)
        else:
            shown = _quote(str(v))
        cells.append(f"{name}={shown}")
    body = " ".join(cells)
    return f"{label}: {body}" if label else body
