"""What the parts of the engine need of each other: one Protocol per service.

The :class:`~applier.apply.handlers.dispatch.Applier` owns its parts
(:class:`~applier.apply.handlers.changes.RowChanges`,
:class:`~applier.apply.rules.resolve.Resolver`,
:class:`~applier.apply.handlers.streamed.StreamedTxns`,
:class:`~applier.apply.handlers.twophase.TwoPhaseTxns`,
:class:`~applier.apply.handlers.schema.SchemaChanges`) and holds the session state
they share: the dispatch state and the live transaction (which the C dispatch loop
reads by name), the transaction in hand, the progress, the counters. A part is
given the Applier typed as the Protocol below that names what it uses, and the
other parts' services it calls, so mypy checks every place where parts meet and a
reader sees each part's dependencies in its constructor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from psycopg import pq

    from applier.apply.core.states import ChangeCtx, State, Txn
    from applier.apply.handlers.spool import SpoolSet
    from applier.apply.handlers.streamed import Live
    from applier.apply.rules.skiprules import Rule
    from applier.apply.target.origin import FlushTracker
    from applier.apply.target.session import TargetSession
    from applier.lsn import Lsn
    from applier.protocol import PgOutputMessage


class Records(Protocol):
    """At a source transaction's end (:class:`~applier.apply.rules.resolve.Resolver`)."""

    def finish_records(self, txn: Txn, end_lsn: Lsn) -> None:
        """Its kept changes and its transaction rule's mark, into the target transaction."""

    def flush_conflicts(self) -> None:
        """Read the results that report conflicts; write the open transaction's ones."""

    def discard(self) -> None:
        """The target transaction was rolled back: forget its conflicts."""


class Resolution(Protocol):
    """What the row-change handlers ask of the resolver (applier.apply.rules.resolve)."""

    def keep(
        self, ctx: ChangeCtx, rule: Rule | None, skipped: bool = True, **error: str | None
    ) -> None:
        """Keep a change a rule skipped, as the rule says (applier.skipped_changes)."""

    def careful(self, ctx: ChangeCtx, send: Callable[[], None]) -> None:
        """Send a change under its own savepoint (careful replay)."""

    def insert_checked(self, ctx: ChangeCtx, res: pq.abc.PGresult) -> None:
        """Read a checked INSERT's result."""

    def rows_checked(self, group: Any, res: pq.abc.PGresult) -> None:
        """Read a multi-row checked INSERT's result."""

    def upsert_checked(self, ctx: ChangeCtx, res: pq.abc.PGresult) -> None:
        """Read an update_missing = apply_remote UPDATE's result."""

    def origin_checked(self, ctx: ChangeCtx, res: pq.abc.PGresult) -> None:
        """Read an origin-checked UPDATE's or DELETE's result."""


class Held(Protocol):
    """The merged rows held back (:class:`~applier.apply.handlers.changes.RowChanges`)."""

    def send_held(self, oid: int | None = None) -> None:
        """Send the rows held for one table (``oid``) or for all."""


class Replay(Protocol):
    """A spooled transaction replayed (:class:`~applier.apply.handlers.streamed.StreamedTxns`)."""

    def replay(self, xid: int, commit_lsn: Lsn, gid: str | None = None, ts: int = 0) -> None:
        """Apply a spooled transaction through the change handlers (state TXN)."""


class SchemaHost(Protocol):
    """What the schema part reads of the Applier (:mod:`applier.apply.handlers.schema`)."""

    @property
    def txn(self) -> Txn | None: ...
    @property
    def live(self) -> Live | None: ...

    def send_held(self, oid: int | None = None) -> None:
        """Send the merged rows held for one table (``oid``) or for all."""


class TxnFlow(Protocol):
    """The Applier's transaction boundaries, which every part's handlers move through."""

    txn: Txn | None
    skipped_txns: int

    @property
    def state(self) -> State: ...
    @property
    def progress(self) -> Lsn: ...
    @property
    def flush(self) -> FlushTracker: ...
    @property
    def session(self) -> TargetSession: ...
    @property
    def spools(self) -> SpoolSet: ...

    def move(self, to: State) -> None:
        """Move the session to state ``to`` (applier.apply.core.states.TRANSITIONS)."""

    def commit_group(self) -> None:
        """Commit the open group (if any)."""

    def start_txn(
        self, xid: int, commit_lsn: Lsn, skip: bool, gid: str | None = None, ts: int = 0
    ) -> None:
        """A source transaction starts: the transaction in hand."""

    def end_txn(self, end_lsn: Lsn, commit_ts: int, groupable: bool = False) -> None:
        """The transaction in hand ends: committed, grouped or skipped."""

    def committed(self, end_lsn: Lsn, ts: int, local: Lsn, txns: int = 1) -> None:
        """A commit (or prepare) outside the pipeline came back: its bookkeeping."""

    def dispatch(self, lsn: Lsn, msg: PgOutputMessage) -> None:
        """One message to its handler."""
