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
                 (the trigger's; see "Its subtransaction" in
                 :mod:`applier.ddl.capture`); absent from ``run``'s
``sig``          the signature (see "Signed"), always the first key

Temporary objects never appear: the trigger does not emit a statement that
touches only temporary objects.

Signed
======

Any source role that may call ``pg_logical_emit_message`` can write a message
of this prefix, and the worker runs what it says on the target. So every
message applier writes is signed with a secret key kept in the source
(``applier_ddl.key``, see :mod:`applier.ddl.capture`): the writer builds the
JSON of every key but ``sig`` (the *body*: any spacing, keys in any order),
takes HMAC-SHA256 of the body's exact bytes under the key, and writes the
content as the body with ``"sig":"<64 lower-case hex digits>",`` put right after
its opening ``{`` (:func:`signed`). The content is still one JSON object.
:func:`split` undoes that, the reader's only way to the body; the worker
runs a message only when the source says its signature is the key's
(``applier_ddl.verify``). The capture's SQL builds the same bytes
(``applier_ddl.signed``; ``tests/ddl/test_sign.py`` holds the two together).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from typing import Literal

from applier.errors import ProtocolError

#: The prefix of the logical decoding message (``pg_logical_emit_message``).
PREFIX = "applier.ddl"
#: The format's version (see the module docstring).
VERSION = 1

Via = Literal["trigger", "run"]

#: What a signed content starts with: ``{"sig":"``, the signature, ``",``.
_SIGNED = re.compile(rb'\{"sig":"([0-9a-f]{64})",')


def signature(body: bytes, key: bytes) -> str:
    """HMAC-SHA256 of ``body`` under ``key``, in hex (what ``sig`` holds)."""
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def signed(body: bytes, key: bytes) -> bytes:
    """The content of a message whose body is ``body`` (a JSON object without ``sig``)."""
    if not body.startswith(b"{") or body.startswith(b"{}"):
        raise ValueError("a message's body is a JSON object with keys")
    return b'{"sig":"' + signature(body, key).encode() + b'",' + body[1:]


def split(content: bytes) -> tuple[bytes, str] | None:
    """(body, signature) of a signed content; None for content not signed this way."""
    found = _SIGNED.match(content)
    if found is None:
        return None
    return b"{" + content[found.end() :], found.group(1).decode()


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
        """The message's body (unsigned: :func:`signed` makes the content), as
        :func:`decode` reads it."""
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
