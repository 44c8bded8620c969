"""What a server refuses of the configuration: errors no restart cures (exit 2).

A wrong password, a role or database that does not exist, no ``pg_hba.conf``
line for the connection, a publication the source lacks: the server answered
and said no, and it will say no again after any number of restarts. The
README's rule for exit codes (would a restart without a change fix it?)
makes these :class:`ConnectRefused` / :class:`PublicationMissing`, both
:class:`~applier.errors.ConfigError` (exit 2): the config names something the
server does not have or accept, so the fix is the config, or creating what it
names. Under systemd ``RestartPreventExitStatus=2 3`` keeps such a worker
stopped instead of restarting it forever. A server that cannot be reached, or
that is starting up or full (``too many clients``), stays transient (exit 1).

Every place that connects asks :func:`refusal` first and raises what it
returns; only when it returns None does the place report its own transient
error.

Why text: a failed connect carries no SQLSTATE in psycopg 3 (libpq keeps only
the text of the server's ``FATAL``), so the server's own phrases are matched,
as :mod:`applier.stream.replconn` did for the replication connection. A
message in another language (the server's ``lc_messages``) is not recognised
and stays transient: a restart loop, as before, never a wrong exit 2.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg.conninfo import conninfo_to_dict

from .errors import ConfigError
from .redact import secret_keys


class ConnectRefused(ConfigError):
    """A server refused the connection the config describes (exit 2)."""


class PublicationMissing(ConfigError):
    """``[source] publications`` names a publication the source does not have (exit 2)."""


#: (phrase of the server's FATAL, SQLSTATE it comes with, what to do or None); the
#: first match wins. A phrase ending in '"' names an object and counts only with
#: "does not exist". A failed connect carries no SQLSTATE (libpq reports the FATAL
#: as text), so this one table tells every connect's failures apart: rows with a
#: hint are refusals of the login (:func:`refusal`); the others are what the
#: replication connection maps on its own (:func:`state_of`).
_PHRASES: tuple[tuple[str, str, str | None], ...] = (
    (
        "password authentication failed",
        "28P01",
        "check the {side} role's password: [{side}] password_file or password_credential, "
        "~/.pgpass or PGPASSWORD (never in the dsn)",
    ),
    ("password is not", "28P01", None),  # "... password is not assigned/valid"
    # libpq's own words, before any message of the server: it asked for a password and
    # none was given (dsn, password_file, password_credential, ~/.pgpass, PGPASSWORD).
    ("no password supplied", "28P01", "the {side} asks for a password: set [{side}] "
     "password_file or password_credential, or put it in ~/.pgpass or PGPASSWORD"),
    ("no pg_hba.conf entry", "28000", "allow this role, database and host in the {side}'s "
     "pg_hba.conf (then reload it), or fix [{side}] dsn"),
    ("is not permitted to log in", "28000", "ALTER ROLE ... LOGIN on the {side}, or fix the "
     "user in [{side}] dsn"),
    ("permission denied for database", "42501", "GRANT CONNECT ON DATABASE ... to the role on "
     "the {side}, or fix [{side}] dsn"),
    ('database "', "3D000", "fix dbname in [{side}] dsn, or create the database on the {side}"),
    ('role "', "28000", "fix the user in [{side}] dsn, or create the role on the {side}"),
    ("superuser or replication role", "42501", None),
    ("permission denied", "42501", None),
    ("too many clients", "53300", None),
    ("wal senders", "53300", None),
)  # fmt: skip

#: The SQLSTATEs of a refusal, when the server's error does carry one.
REFUSAL_STATES = frozenset({"28P01", "28000", "3D000"})


def refusal(exc: psycopg.Error, side: str, conninfo: str) -> ConnectRefused | None:
    """The error to raise when ``exc`` (from connecting to ``conninfo``) is a refusal.

    None when it is not one (unreachable, starting up, too many clients):
    the caller raises its own transient error then. ``side``: "source" or "target".
    """
    reason = _server_message(str(exc))
    found = _match(reason.lower())
    if found is not None and found[1] is None:
        found = None  # not a refused login: the caller's own error
    if found is None and exc.sqlstate not in REFUSAL_STATES:
        return None
    state, hint = found or (exc.sqlstate, "fix [{side}] dsn")
    assert hint is not None
    return ConnectRefused(
        f"the {side} refused the connection ({where(conninfo)}): {reason}",
        hint=hint.format(side=side),
        sqlstate=exc.sqlstate or state,
    )


@contextmanager
def raise_refusal(side: str, conninfo: str) -> Iterator[None]:
    """Around a connect: a refusal becomes :class:`ConnectRefused`, anything else passes."""
    try:
        yield
    except psycopg.Error as e:
        refused = refusal(e, side, conninfo)
        if refused is not None:
            raise refused from None
        raise


def where(conninfo: str) -> str:
    """``user=... dbname=... host=... port=...`` of a DSN: enough to say which, no secret."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    hidden = secret_keys()
    keys = ("user", "dbname", "host", "hostaddr", "port")
    return " ".join(f"{k}={params[k]}" for k in keys if params.get(k) and k not in hidden)


def _server_message(text: str) -> str:
    """The server's own words (after libpq's "connection to server ... failed: FATAL:")."""
    for line in text.splitlines():
        if "FATAL:" in line:
            return line.split("FATAL:", 1)[1].strip()
    return (text.strip().splitlines() or ["connection refused"])[-1].strip()


def state_of(message: str) -> str | None:
    """The SQLSTATE a failed connect's ``message`` comes with (None: none of ours).

    For a replication connection, whose failures its own module maps to errors.
    """
    found = _match(message.lower())
    return found[0] if found else None


def _match(low: str) -> tuple[str, str | None] | None:
    """(SQLSTATE, hint) of the first phrase the server's message has."""
    for phrase, state, hint in _PHRASES:
        if phrase in low and (not phrase.endswith('"') or "does not exist" in low):
            return state, hint
    return None


def check_publications(wanted: Iterable[str], existing: Iterable[str]) -> None:
    """Refuse (exit 2) when the source lacks a configured publication, naming what it has.

    Checked before streaming: pgoutput looks a publication up only when the
    first change arrives, so START_REPLICATION with a misspelled name
    succeeds and fails later, after "connected" was logged.
    """
    have = sorted(set(existing))
    missing = [p for p in dict.fromkeys(wanted) if p not in have]
    if not missing:
        return
    names = ", ".join(repr(p) for p in missing)
    there = ", ".join(repr(p) for p in have) or "none"
    raise PublicationMissing(
        f"publication(s) {names} do not exist on the source (it has: {there})",
        hint="fix [source] publications, or create them on the source "
        "(CREATE PUBLICATION ... FOR TABLE ...)",
    )
