"""Whether an ``applier.ddl`` message was written by applier: its signature, asked of the source.

Any source role that may call ``pg_logical_emit_message`` can write a message
of applier's prefix; the worker runs only those signed with the key the
capture keeps in the source (see "Signed" in :mod:`applier.ddl.message`).
The key never leaves the source: the worker sends the message's body and
signature to ``applier_ddl.verify`` (``SECURITY DEFINER``, everyone's; it
answers only yes or no), on a connection of its own opened for it and closed
after, as schema follow reads the source's catalog. Captured DDL is rare: one
round trip each is nothing beside running it.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from applier.apply.handlers.sourceconn import open_source
from applier.ddl.capture import SCHEMA
from applier.ddl.message import split
from applier.errors import TransientError

#: The source's verifier (``applier ddl install`` creates it).
VERIFY = f"{SCHEMA}.verify(bytea, text)"


class Signatures:
    """Asks the source whether a message's signature is its key's."""

    def __init__(self, source_conninfo: str) -> None:
        self.source_conninfo = source_conninfo

    def refusal(self, content: bytes) -> str | None:
        """Why the message is not applier's (None: it is, signed with the key)."""
        parts = split(content)
        if parts is None:
            return "it carries no signature"
        body, sig = parts
        with self._source() as src:
            try:
                if src.execute(
                    "SELECT pg_catalog.to_regprocedure(%s) IS NULL", (VERIFY,)
                ).fetchone() != (False,):
                    return f"the source has no {SCHEMA}.verify: applier ddl install is not there"
                row = src.execute(
                    sql.SQL("SELECT {}.verify(%s, %s)").format(sql.Identifier(SCHEMA)),
                    (body, sig),
                ).fetchone()
            except psycopg.OperationalError as e:
                raise _lost(e) from None
        if row is None or row[0] is None:
            return f"the source has no key in {SCHEMA}.key to verify its signature"
        return None if row[0] else "its signature is not the source's key's"

    def _source(self) -> psycopg.Connection[Any]:
        return open_source(self.source_conninfo, "applier ddl verify", _DOING)


_DOING = "verifying a captured DDL message on the source"


def _lost(e: psycopg.OperationalError) -> TransientError:
    return TransientError(f"{_DOING}: {str(e).strip()}")


__all__ = ["Signatures"]
