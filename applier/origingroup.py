"""An origin's group: the names of parallel apply's origins and the SQL of its progress.

With ``[apply] workers`` > 1 each target session before PostgreSQL 19 holds an
origin of its own, ``<origin>.<n>``, beside the plain ``<origin>`` the worker's
own session holds (:mod:`applier.apply.parallel.origins` proves why the largest
progress among them is where the stream restarts). Everything that asks how far
the target is - the worker, ``status``, ``cutover``, ``skip``, table syncs -
reads that largest progress, through :func:`progress_sql`; a plain origin read
alone would lag the group. Here, below every part that asks, so that each reads
it the same way.
"""

from __future__ import annotations

#: Between an origin's name and a member's number: outside the config's
#: [a-z0-9_], so a member is never another worker's origin.
SEPARATOR = "."


def member(origin: str, index: int) -> str:
    """Session ``index``'s origin (1-based) in the group of ``origin``."""
    if index < 1:
        raise ValueError(f"session index {index}: sessions are numbered from 1")
    return f"{origin}{SEPARATOR}{index}"


def progress_sql(name: str = "%s", flushed: bool = True) -> str:
    """A SQL expression: the largest progress of the origin ``name`` (a placeholder,
    or an expression of the query it goes into) and its group, NULL when none of
    them exists or has progress (``flushed``: only what is durable, as after a
    crash). The config allows origin names of ``[a-z0-9_]`` only, so the name needs
    no escaping in the pattern."""
    # ``name`` is a placeholder or a column of the calling query (not of alias
    # ``m``, the one inside), never a value.
    return _PROGRESS.replace("FLUSHED", "true" if flushed else "false").replace("NAME", name)


def members_sql(name: str = "%s") -> str:
    """A SQL condition on a ``roname`` column: the origin is a member of ``name``'s
    group (``<name>.<n>``, not ``name`` itself); ``name`` as in :func:`progress_sql`."""
    return f"roname OPERATOR(pg_catalog.~) {_pattern(name, plain=False)}"


def _pattern(name: str, plain: bool) -> str:
    """The one rule of who is in the group: ``<name>.<n>`` (and ``name``, ``plain``)."""
    tail = "([.][0-9]+)?$" if plain else "[.][0-9]+$"
    return f"('^' OPERATOR(pg_catalog.||) {name} OPERATOR(pg_catalog.||) '{tail}')"


_PROGRESS = (
    "(SELECT pg_catalog.max(pg_catalog.pg_replication_origin_progress(m.roname, FLUSHED)) "
    "FROM pg_catalog.pg_replication_origin m WHERE m.roname OPERATOR(pg_catalog.~) "
    + _pattern("NAME", plain=True)
    + ")"
)
