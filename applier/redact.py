"""What of a connection string may reach a log: nothing secret.

:func:`redact_dsn` is the only way a DSN reaches a log or an error: every
value of a libpq keyword that libpq itself calls password-like (and the SCRAM
keys, whatever libpq is loaded) becomes ``***``. libpq's own complaint about a
malformed DSN quotes the piece it choked on, which can be part of a password:
:func:`redact_conninfo_error` hides what it quotes.
"""

from __future__ import annotations

import functools
import re

import psycopg
from psycopg.conninfo import conninfo_to_dict

#: libpq keywords whose values are secrets: libpq's own "password-like"
#: ones (dispchar ``*``) plus the SCRAM keys, whatever libpq version is loaded.
_SECRET_KEYS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)


@functools.cache
def secret_keys() -> frozenset[str]:
    """Every libpq keyword whose value must never be shown."""
    from psycopg import pq

    try:
        starred = {o.keyword.decode() for o in pq.Conninfo.get_defaults() if o.dispchar == b"*"}
    except psycopg.Error:  # pragma: no cover - libpq without conninfo defaults
        starred = set()
    return _SECRET_KEYS | starred


def redact_dsn(dsn: str) -> str:
    """A DSN fit for logs: every secret (password, sslpassword, ...) replaced by ``***``."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    hidden = secret_keys()
    return " ".join(f"{k}={'***' if k in hidden else v}" for k, v in params.items())


_QUOTED = re.compile(r'"[^"]*"')


def redact_conninfo_error(message: str) -> str:
    """libpq's complaint about a DSN, one line, without the text it quotes.

    libpq quotes the piece it choked on (``missing "=" after "..."``,
    ``invalid percent-encoded token: "..."``), which can be part of a password.
    """
    return _QUOTED.sub('"***"', " ".join(message.split())).replace('missing "***"', 'missing "="')
