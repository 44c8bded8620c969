"""The apply session's states (see :mod:`applier.apply.handlers.dispatch`, "Session states").

Transitions
===========

The session state moves only through :meth:`Applier.move
<applier.apply.handlers.dispatch.Applier.move>`, which checks the move against
:data:`TRANSITIONS`, the one table of allowed moves (h11 keeps its in one place
too). Which messages may arrive in which state is the dispatch table's
(:mod:`applier.apply.handlers.dispatch`); this table says where their handlers
may take the session:

* ``IDLE -> TXN``: Begin; a spooled transaction replayed at its Stream Commit or
  Stream Prepare. ``IDLE -> PREPARE``: Begin Prepare. ``IDLE -> STREAM``: Stream Start.
* ``TXN -> IDLE``: Commit; the end of a replay. ``PREPARE -> IDLE``: Prepare.
  ``STREAM -> IDLE``: Stream Stop.
* ``STREAM -> TXN -> STREAM``: a change of the live streamed transaction, applied
  through the change handlers inside its stream block
  (:mod:`applier.apply.handlers.streamed`, "Live apply").
* ``any -> IDLE``: a stop or an error rolls back what is in hand
  (``Applier.abandon``); ``IDLE -> IDLE`` a replay's end that found it ended.

Any other move is a bug of ours, not of the stream: :class:`IllegalTransition`,
naming both states. The C dispatch loop (``_dispatch.c``) reads the state the
move set; it never sets it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from applier.apply.sql.mapping import RelMap
from applier.apply.sql.planner import key_of
from applier.lsn import Lsn
from applier.protocol import decode_streamed


class State(enum.Enum):
    IDLE = "idle"
    TXN = "in transaction"
    PREPARE = "in prepared transaction"
    STREAM = "in stream"

    # Enum hashes by name in Python code; members are singletons, so identity will do
    # (dispatch checks the state of every message against a frozenset).
    __hash__ = object.__hash__


IDLE, TXN, PREPARE, STREAM = State.IDLE, State.TXN, State.PREPARE, State.STREAM

#: Where the session may move from each state (the module's "Transitions").
TRANSITIONS: dict[State, frozenset[State]] = {
    IDLE: frozenset({IDLE, TXN, PREPARE, STREAM}),
    TXN: frozenset({IDLE, STREAM}),
    PREPARE: frozenset({IDLE}),
    STREAM: frozenset({IDLE, TXN}),
}


class IllegalTransition(RuntimeError):
    """A handler moved the session where :data:`TRANSITIONS` does not allow: our bug."""

    def __init__(self, frm: State, to: State) -> None:
        super().__init__(f"internal error: the apply session moved from {frm.value} to {to.value}")
        self.frm = frm
        self.to = to


def check_move(frm: State, to: State) -> State:
    """``to``, if the session may move there from ``frm``; else :class:`IllegalTransition`."""
    if to not in TRANSITIONS[frm]:
        raise IllegalTransition(frm, to)
    return to


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
    #: The txn skip rule that skips all of it (applier.apply.rules.skiprules).
    rule: Any = None
    #: Changes to write to applier.skipped_changes at its end.
    kept: list[Any] = field(default_factory=list)
    #: Every change seen, while some rule keeps whole transactions (dump = all).
    seen: list[Any] | None = None
    #: Not applied for its replication origin (``[source] origin = "none"``).
    filtered: bool = False
    #: It changed the target's schema (applier.apply.handlers.schema): it commits
    #: alone, never grouped with the source transactions after it.
    barrier: bool = False


class ChangeCtx:
    """What identifies one applied change in errors, conflict and skip records."""

    __slots__ = ("change", "check", "key", "lsn", "no", "rm", "txn", "xid")

    def __init__(self, lsn: Lsn, txn: Txn, rm: RelMap, change: Any) -> None:
        self.lsn = lsn
        self.txn = txn
        self.xid = txn.xid
        self.no = txn.n
        self.rm = rm
        self.change = change
        #: For a statement of applier.apply.rules.conflicts: reads its result.
        self.check: Any = None
        #: The key values of a checked INSERT in a run (applier.apply.target.session).
        self.key: Any = None

    def describe(self) -> dict[str, Any]:
        return {
            "lsn": str(Lsn(self.lsn)),
            "xid": self.xid,
            "table": self.rm.qualname,
            "op": op_of(self.change),
            "key": key_of(self.rm, self.change),
        }


#: The slot of ChangeCtx.change, which LaneCtx fills on first use.
_CHANGE: Any = ChangeCtx.__dict__["change"]


class LaneCtx(ChangeCtx):
    """A :class:`ChangeCtx` whose change is decoded from its bytes when first asked for."""

    __slots__ = ("data",)
    #: How its bytes decode (a streamed change's; applier.apply.batching.insertlane: an Insert's).
    decode: Any = staticmethod(decode_streamed)

    def __init__(self, lsn: Lsn, txn: Txn, rm: RelMap, data: Any) -> None:
        # ChangeCtx.__init__'s assignments but the change's: one call less per row.
        self.lsn = lsn
        self.txn = txn
        self.xid = txn.xid
        self.no = txn.n
        self.rm = rm
        self.data = data
        self.check = None
        self.key = None

    @property
    def change(self) -> Any:
        try:
            return _CHANGE.__get__(self, ChangeCtx)
        except AttributeError:
            change = self.decode(self.data)
            _CHANGE.__set__(self, change)
            return change

    @change.setter
    def change(self, value: Any) -> None:
        _CHANGE.__set__(self, value)


#: What the merge lane holds for a row instead of its context, which is made only if
#: something asks for it (a row not found, an error): ``(lsn, data, no, txn)``, where
#: ``data`` is the streamed change's bytes, or the Update message itself
#: (:func:`applier.apply.batching.mergelane.hold_update`).
LaneRef = tuple[int, Any, int, Txn]


def lane_ctx(ref: LaneRef, rm: RelMap) -> ChangeCtx:
    """The context a :data:`LaneRef` stands for."""
    lsn, data, no, txn = ref
    ctx = (
        LaneCtx(Lsn(lsn), txn, rm, data)
        if type(data) is bytes
        else ChangeCtx(Lsn(lsn), txn, rm, data)
    )
    ctx.no = no
    return ctx


_OPS = {"Insert": "insert", "Update": "update", "Delete": "delete", "Truncate": "truncate"}


def op_of(change: Any) -> str:
    """The operation of a change as skip rules and records name it."""
    return _OPS.get(type(change).__name__, "change")


class MergedCtx:
    """What identifies a multi-row statement's rows: one change context per row, in order.

    Also for the multi-row INSERTs of :class:`~applier.apply.target.session.TargetSession`.
    A row the merge lane held has a :data:`~applier.apply.core.states.LaneRef` in place
    of its context until :attr:`ctxs` is first read (a row not found, an error):
    most statements find all their rows, and never make one.
    """

    __slots__ = ("_ctxs", "_lazy", "rm")

    def __init__(self, ctxs: list[Any], rm: RelMap | None = None, lazy: bool = False) -> None:
        self._ctxs = ctxs
        #: Some items are LaneRefs of rows of ``rm``.
        self._lazy = lazy
        self.rm: RelMap = ctxs[0].rm if rm is None else rm

    def __len__(self) -> int:
        return len(self._ctxs)

    @property
    def ctxs(self) -> list[Any]:
        if self._lazy:
            rm = self.rm
            self._ctxs = [lane_ctx(c, rm) if type(c) is tuple else c for c in self._ctxs]
            self._lazy = False
        return self._ctxs

    def describe(self) -> dict[str, Any]:
        lsns = [c.lsn for c in self.ctxs]
        return {
            "lsn": f"{Lsn(min(lsns))}..{Lsn(max(lsns))}",
            "table": self.ctxs[0].rm.qualname,
            "merged_changes": len(self.ctxs),
        }


class OpenHost(Protocol):
    """What :func:`open_state_of` reads."""

    state: State

    @property
    def live(self) -> object | None: ...


def open_state_of(applier: OpenHost) -> Callable[[], State | None]:
    """What the C dispatch loop (``dispatch_batch``) calls per message: the session
    state while :meth:`Applier.dispatch`'s common path is open (no live transaction
    to drop), else None."""

    def open_state() -> State | None:
        return applier.state if applier.live is None else None

    return open_state
