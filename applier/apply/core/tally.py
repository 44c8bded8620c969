"""Counts of what the apply engine did, for the metrics endpoint (:mod:`applier.apply.metrics`).

The handlers count each change of the open target transaction in plain dicts
(:attr:`Tally.changes` and friends: one dict update per change, no locks, no
metrics library on the hot path). When that target transaction commits, its
counts move to the totals (:meth:`Tally.commit`, from the commit's ``done``
callback, i.e. once the target answered the COMMIT); when it is rolled back
(a failed group replayed one by one, a lost connection, a stop) they are
dropped (:meth:`Tally.discard`) and counted again when the transactions are
replayed. So the totals are those of committed source transactions, never
counted twice.

Changes are keyed by the relation's OID while counting (a tuple of an int and
a constant string hashes cheaply; building the schema-qualified name per change
doubled the cost) and named at commit, once per table and group.

The metrics thread reads the totals while the apply thread updates them in
place: it only ever takes copies (``dict.copy()`` runs in C holding the GIL, so
it never sees a dict resized under it) and iterates those.

:func:`fault_side` names the side of a fault the worker retries
(``applier_reconnects_total{side}``). This module imports no metrics library:
``applier run`` without ``[metrics]`` never loads one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: (table, operation) -> count, (table, reason) -> count, (table, type, resolution) -> count.
Counts = dict[tuple[str, ...], int]


class Tally:
    """Per target transaction counts (open), and the totals of committed ones."""

    __slots__ = (
        "applied",
        "changes",
        "conflicts",
        "conflicts_total",
        "group_sizes",
        "skipped",
        "skipped_total",
    )

    def __init__(self) -> None:
        #: Open target transaction: (relation oid, op) -> changes sent to the target.
        self.changes: dict[tuple[int, str], int] = {}
        #: Open target transaction: (table, reason) -> changes not applied.
        self.skipped: Counts = {}
        #: Open target transaction: (table, conflict type, resolution) -> conflicts.
        self.conflicts: Counts = {}
        #: Totals of committed target transactions.
        self.applied: Counts = {}
        self.skipped_total: Counts = {}
        self.conflicts_total: Counts = {}
        #: Source transactions per target commit -> how many commits had that many.
        self.group_sizes: dict[int, int] = {}

    # -- while applying (apply thread) ---------------------------------------------------

    def skip(self, table: str, reason: str, n: int = 1) -> None:
        k = (table, reason)
        self.skipped[k] = self.skipped.get(k, 0) + n

    def sent(self, key: tuple[int, str], n: int) -> None:
        """``n`` changes ``key`` = (relation oid, op) sent at once (a lane's run of rows;
        one change inlines this dict update)."""
        self.changes[key] = self.changes.get(key, 0) + n

    def unapply(self, oid: int, op: str) -> None:
        """A change counted as applied was skipped after all (a failing change an
        error rule took during careful replay)."""
        k = (oid, op)
        if self.changes.get(k):
            self.changes[k] -= 1

    def conflicts_met(self, conflicts: Iterable[Any], into: Counts | None = None) -> None:
        """The conflicts written into the open target transaction (resolve.Conflict),
        or ``into`` the conflicts of counts already taken (found after its commit)."""
        c = self.conflicts if into is None else into
        for x in conflicts:
            k = (x.ctx.rm.qualname, x.kind, x.resolution)
            c[k] = c.get(k, 0) + 1

    def take(self, relmaps: Mapping[int, Any]) -> tuple[Counts, Counts, Counts]:
        """The open transaction's counts, named by the relations' current mappings
        (``relmaps``: oid -> RelMap), to add at its commit; counting starts over."""
        changes: Counts = {}
        for (oid, op), n in self.changes.items():
            if n:
                rm = relmaps.get(oid)
                k = (rm.qualname if rm is not None else str(oid), op)
                changes[k] = changes.get(k, 0) + n
        taken = (changes, self.skipped, self.conflicts)
        self.changes, self.skipped, self.conflicts = {}, {}, {}
        return taken

    def commit(self, taken: tuple[Counts, Counts, Counts], txns: int) -> None:
        """A target transaction of ``txns`` source transactions committed."""
        changes, skipped, conflicts = taken
        _add(self.applied, changes)
        _add(self.skipped_total, skipped)
        _add(self.conflicts_total, conflicts)
        if txns > 0:
            sizes = self.group_sizes
            sizes[txns] = sizes.get(txns, 0) + 1

    def discard(self) -> None:
        """The open target transaction was rolled back: its changes will be replayed."""
        self.changes, self.skipped, self.conflicts = {}, {}, {}

    def absorb(self, other: Tally) -> None:
        """Add ``other``'s committed totals to these and empty them (a parallel apply
        session's tally into the worker's, under the pool's lock)."""
        _add(self.applied, other.applied)
        _add(self.skipped_total, other.skipped_total)
        _add(self.conflicts_total, other.conflicts_total)
        for size, n in other.group_sizes.items():
            self.group_sizes[size] = self.group_sizes.get(size, 0) + n
        other.applied, other.skipped_total, other.conflicts_total = {}, {}, {}
        other.group_sizes = {}


def _add(total: Counts, more: Counts) -> None:
    for k, n in more.items():
        total[k] = total.get(k, 0) + n


def fault_side(exc: BaseException) -> str:
    """Which side a retried fault came from: ``source``, ``target`` or ``local``.

    The innermost applier frame that raised it tells: the replication stream's code
    (``applier.stream``) talks only to the source, a spool file is local, everything
    else the worker retries is a target connection. A psycopg error turned into a
    TransientError by the worker itself is judged by where the psycopg error arose.
    """
    module = _raised_in(exc)
    if module == "applier.apply.worker" and exc.__context__ is not None:
        module = _raised_in(exc.__context__) or module
    if module.startswith("applier.stream"):
        return "source"
    if module == "applier.apply.handlers.spool":
        return "local"
    return "target"


def _raised_in(exc: BaseException) -> str:
    module = ""
    tb = exc.__traceback__
    while tb is not None:
        name = str(tb.tb_frame.f_globals.get("__name__", ""))
        if name.startswith("applier."):
            module = name
        tb = tb.tb_next
    return module


def count_fault(reconnects: dict[str, int], exc: BaseException) -> None:
    side = fault_side(exc)
    reconnects[side] = reconnects.get(side, 0) + 1
