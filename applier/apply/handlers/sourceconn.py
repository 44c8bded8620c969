"""A short-lived connection to the source, for the handlers' rare questions to it.

Schema follow reads the source's catalog when a Relation message shows what
the target lacks, and captured DDL asks the source whether a message is
signed with its key; both are cold paths (a schema change), so each opens a
connection through :func:`applier.pgconn.connect` (the pinned session) and
closes it after, rather than hold one for months. A source that cannot be
reached is a :class:`~applier.errors.TransientError`: the worker retries.
"""

from __future__ import annotations

from typing import Any

import psycopg

from applier import pgconn
from applier.errors import TransientError


def open_source(conninfo: str, purpose: str, doing: str) -> psycopg.Connection[Any]:
    """A connection to the source for ``purpose``; ``doing`` names the work in the error."""
    try:
        return pgconn.connect(conninfo, side="source", purpose=purpose)
    except psycopg.OperationalError as e:
        raise TransientError(f"{doing}: {str(e).strip()}") from None


__all__ = ["open_source"]
