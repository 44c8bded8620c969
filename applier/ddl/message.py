"""The ``applier.ddl`` logical decoding message: one format, written and read here.

Two writers produce it on the source, inside the transaction that runs the
statement: the event trigger ``applier ddl install`` creates (its JSON is built
in SQL with ``jsonb_build_object``, key for key as :meth:`DdlMessage.encode`
writes it) and ``applier ddl run``. The worker reads it with :func:`decode`.

The content is UTF-8 JSON, an object with these keys (a reader ignores keys it
does not know, so a newer writer can add some; ``v`` changes only when a key's
meaning does):

``v``            1
``tag``          the command tag, as ``pg_event_trigger_ddl_commands()`` and
                 ``TG_TAG`` give it (``ALTER TABLE``, ``CREATE INDEX``, ...)
``statement``    the statement the source ran, as the client sent it
                 (``current_query()``; for ``ddl run``, the given text)
``search_path``  the source session's ``search_path`` when it ran, so that
                 unqualified names resolve on the target as they did there
``objects``      what it created, altered or dropped: a list of objects with
                 ``kind`` (``object_type``: ``table``, ``index``, ``type``,
                 ``table column``, ...), ``schema`` (null for objects without
                 one, e.g. a schema), ``identity`` (``object_identity``:
                 quoted and schema-qualified as PostgreSQL prints it) and
                 ``dropped`` (from ``sql_drop``)
``via``          ``trigger`` or ``run``
``subxact``      the xid of the (sub)transaction the message was written in
                 (the trigger's, capture version 2; see "Its subtransaction"
                 in :mod:`applier.ddl.capture`); absent from ``run``'s

Temporary objects never appear: the trigger does not emit a statement that
touches only temporary objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from applier.errors import ProtocolError

#: The prefix of the logical decoding message (``pg_logical_emit_message``).
PREFIX = "applier.ddl"
#: The format's version (see the module docstring).
VERSION = 1

Via = Literal["trigger", "run"]


@dataclass(frozen=True, slots=True)
class DdlObject:
    """One object a captured statement created, altered or dropped."""

    kind: str
    schema: str | None
    identity: str
    dropped: bool = False


@dataclass(frozen=True, slots=True)
class DdlMessage:
    """A statement captured on the source, at its position in the stream."""

    tag: str
    statement: str
    search_path: str
    objects: tuple[DdlObject, ...]
    via: Via = "trigger"
    #: The xid of the subtransaction that wrote it (None: not known, the top level's):
    #: where the statement was written, not what it is, so not compared.
    subxact: int | None = field(default=None, compare=False)

    def encode(self) -> bytes:
        """The message's content, as :func:`decode` reads it."""
        doc = {
            "v": VERSION,
            "tag": self.tag,
            "statement": self.statement,
            "search_path": self.search_path,
            "objects": [
                {"kind": o.kind, "schema": o.schema, "identity": o.identity, "dropped": o.dropped}
                for o in self.objects
            ],
            "via": self.via,
        }
        if self.subxact is not None:
            doc["subxact"] = self.subxact
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def decode(content: bytes, lsn: str | None = None) -> DdlMessage:
    """Read an ``applier.ddl`` message's content; a malformed one is a ProtocolError.

    Malformed means written by something that is not applier (or a newer
    format): the worker cannot know what to run, so it stops and says so.
    """
    try:
        doc = json.loads(content.decode())
        if not isinstance(doc, dict) or doc.get("v") != VERSION:
            raise ValueError(f"format version {doc.get('v') if isinstance(doc, dict) else '?'}")
        objects = tuple(_object(o) for o in doc.get("objects") or ())
        via = doc.get("via", "trigger")
        if via not in ("trigger", "run"):
            raise ValueError(f"via {via!r}")
        sub = doc.get("subxact")
        if sub is not None and (type(sub) is not int or sub <= 0):
            raise ValueError(f"subxact {sub!r}")
        return DdlMessage(
            tag=_text(doc, "tag"),
            statement=_text(doc, "statement"),
            search_path=_text(doc, "search_path"),
            objects=objects,
            via=via,
            subxact=sub,
        )
    except (ValueError, UnicodeDecodeError, TypeError) as e:
        raise ProtocolError(
            f"unreadable {PREFIX} message: {e}",
            lsn=lsn,
            hint=f"a {PREFIX} message is written by applier's DDL capture of the same "
            "version as this worker; upgrade applier, or skip it with "
            f"applier skip add --ddl-lsn {lsn or 'LSN'}",
        ) from None


def _text(doc: dict[str, object], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key!r} missing or not text")
    return value


def _object(o: object) -> DdlObject:
    if not isinstance(o, dict):
        raise ValueError("an object that is not a JSON object")
    schema = o.get("schema")
    if schema is not None and not isinstance(schema, str):
        raise ValueError("an object's 'schema' is not text")
    return DdlObject(
        kind=_text(o, "kind"),
        schema=schema,
        identity=_text(o, "identity"),
        dropped=bool(o.get("dropped", False)),
    )
