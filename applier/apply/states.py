"""The apply session's states (see :mod:`applier.apply.handlers`, "Session states")."""

from __future__ import annotations

import enum
from dataclasses import dataclass

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


@dataclass
class Txn:
    xid: int
    commit_lsn: Lsn
    skip: bool
    gid: str | None = None
