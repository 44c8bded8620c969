"""Commits noted as pending before their handler runs: what the lag is measured from.

Every message that brings a source commit (or prepare) to apply is noted in
the worker's :class:`~applier.lag.PendingCommits`, with its position (the start
of its record: finished once the done position is past it) and its time,
before its handler runs; :mod:`applier.lag` says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from applier.lag import PendingCommits
from applier.lsn import Lsn
from applier.protocol import (
    Begin,
    BeginPrepare,
    CommitPrepared,
    RollbackPrepared,
    StreamCommit,
    StreamPrepare,
)

Handler = Callable[[Lsn, Any], None]

#: The messages that bring a commit, and where their position and time are.
PENDING_AT: dict[type, Callable[[Any], tuple[Lsn, int]]] = {
    Begin: lambda m: (m.final_lsn, m.commit_ts),
    StreamCommit: lambda m: (m.commit_lsn, m.commit_ts),
    BeginPrepare: lambda m: (m.prepare_lsn, m.prepare_ts),
    StreamPrepare: lambda m: (m.prepare_lsn, m.prepare_ts),
    CommitPrepared: lambda m: (m.commit_lsn, m.commit_ts),
    # It carries no start of its record: its end, less one, is passed exactly when it is.
    RollbackPrepared: lambda m: (Lsn(m.rollback_end_lsn - 1), m.rollback_ts),
}


def note_pending(
    handlers: dict[type, tuple[Any, Handler]], pending: Callable[[], PendingCommits]
) -> None:
    """Wrap the handlers of :data:`PENDING_AT`'s messages so that each notes its
    commit in ``pending()`` (read at each call: the worker's outlives sessions)."""
    for kind, at in PENDING_AT.items():
        states, handler = handlers[kind]
        handlers[kind] = (states, _noting(at, handler, pending))


def _noting(
    at: Callable[[Any], tuple[Lsn, int]], handler: Handler, pending: Callable[[], PendingCommits]
) -> Handler:
    def handle(lsn: Lsn, m: Any) -> None:
        pending().received(*at(m))
        handler(lsn, m)

    return handle
