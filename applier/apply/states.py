"""The apply session's states (see :mod:`applier.apply.handlers`, "Session states")."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from applier.lsn import Lsn


class State(enum.Enum):
    IDLE = "idle"
    TXN = "in transaction"
    PREPARE = "in prepared transaction"
    STREAM = "in stream"

    # Enum hashes by name in Python code; members are singletons, so identity will do
    # (dispatch checks the state of every message against a frozenset).
    __hash__ = object.__hash__


IDLE, TXN, PREPARE, STREAM = State.IDLE, State.TXN, State.PREPARE, State.STREAM


@dataclass(slots=True)
class Txn:
    xid: int
    #: The finish LSN: the start of the commit (or prepare) record; skip rules name it.
    commit_lsn: Lsn
    skip: bool
    gid: str | None = None
    commit_ts: int = 0
    end_lsn: Lsn | None = None
    #: Changes of included tables so far (their number in conflict and skip records).
    n: int = 0
    #: The txn skip rule that skips all of it (applier.apply.skiprules).
    rule: Any = None
    #: Changes to write to applier.skipped_changes at its end.
    kept: list[Any] = field(default_factory=list)
    #: Every change seen, while some rule keeps whole transactions (dump = all).
    seen: list[Any] | None = None
