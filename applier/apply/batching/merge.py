"""UPDATEs merged per key, DELETEs by key in bulk, within one target transaction.

Planning only, no I/O.

A group of source transactions commits as one target transaction (worker,
"Group commit"), so no one on the target sees the rows between its changes:
only each row's final state counts. An UPDATE that keeps its key therefore
need not run when it arrives. :class:`UpdateMerger` holds the newest values
per (table, key), and a table's held rows go out together as a few multi-row
statements (:meth:`Planner.update_many`, chunks of power-of-two sizes so a
table needs only a handful of prepared statements). pgbench's one branch row,
updated a hundred times in a group, becomes one row of one statement.

An unchanged TOAST value (kind ``u``) keeps what an earlier UPDATE of the same
key set, if any; columns that no held UPDATE set stay out of SET, as for a
single UPDATE. Rows held with different SET columns go in different statements.

DELETEs by key are held the same way (:meth:`UpdateMerger.add_delete`) and go
out as ``DELETE ... USING (VALUES ...) RETURNING ordinal`` in the same chunks
(:meth:`Planner.delete_many`); a key deleted twice before they go out (the
second finds no row) sends the first ones before it. Changes of a REPLICA
IDENTITY FULL table that no index can search are held too, by
:mod:`applier.apply.batching.fullident`.

Order
=====

A table holds one kind of change at a time (merged UPDATEs, DELETEs or FULL
identity changes): a change of another kind first sends what the table holds,
so within a table changes reach the target in source order (a DELETE after
UPDATEs of the same key goes after them). Likewise any other change
to a table (INSERT, an UPDATE that changes the key or cannot be
merged) first sends the rows held for it. Across tables the order may
change. Only tables where that cannot be told apart are merged
(:attr:`RelMap.merge`): no trigger or rule fires for replication on them,
no unique index or exclusion constraint other than the key's could see an
intermediate state the source never had, and the key is unique on the target
(so a statement that returns fewer rows than it holds tells exactly which
were missing). A change to a table with such a
trigger or rule first sends everything held, as do TRUNCATE, a Relation
message, COMMIT and PREPARE.

Rows not found, errors, memory
==============================

Each statement returns the ordinals of the rows it updated or deleted; a held
row not returned is a missing row, reported like a single statement's (the
pipeline calls ``on_missing`` with the change's context); for merged UPDATEs
with the context of the last change merged into it (so N UPDATEs of one
missing row count once). A failing merged statement names its table and the
span of changes; the worker then applies
those transactions again one by one without merging, so the error names the
exact change. At most :data:`MAX_HELD` keys are held per table, and UPDATEs
whose values reach :data:`~applier.apply.sql.planner.MAX_HELD_BYTES`: a larger
transaction sends them and goes on.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

from applier.apply.batching.fullident import FullHold
from applier.apply.core.states import MergedCtx
from applier.apply.sql.mapping import RelMap
from applier.apply.sql.planner import (
    MAX_HELD_BYTES,
    Formats,
    Params,
    Planner,
    Stmt,
    max_rows,
    param_formats,
)
from applier.apply.sql.stmt import MAX_HELD, chunks
from applier.protocol import Delete, Update

#: What ``add``/``add_delete`` return when the table holds another kind of change
#: (or the change cannot join what it holds): send the table's held rows, then add again.
AGAIN = -1
_U = ord("u")


#: A held row: its values, their kinds, and its context (or the lane's LaneRef).
_Held = tuple[Sequence[bytes | None], bytes, Any]


class HeldUpdates:
    """A table's merged UPDATEs: the newest values by key."""

    __slots__ = ("rm", "rows", "size")

    def __init__(self, rm: RelMap) -> None:
        self.rm = rm
        self.rows: dict[Hashable, _Held] = {}
        #: Bytes of the values put (an upper bound of what is held).
        self.size = 0

    def put(
        self, key: Hashable, values: Sequence[bytes | None], kinds: bytes, ctx: Any, size: int
    ) -> int:
        """Hold the newest values of ``key`` (``size`` bytes at most); how many keys
        are held now, :data:`MAX_HELD` once their values reach MAX_HELD_BYTES."""
        self.size += size
        rows = self.rows
        held = rows.get(key)
        if held is None or _U not in kinds:
            rows[key] = (values, kinds, ctx)
        else:
            # Unchanged TOAST values keep what an earlier UPDATE of the key set.
            merged_values = list(held[0])
            merged_kinds = bytearray(held[1])
            for i, k in enumerate(kinds):
                if k != _U:
                    merged_values[i] = values[i]
                    merged_kinds[i] = k
            rows[key] = (merged_values, bytes(merged_kinds), ctx)
        return len(rows) if self.size < MAX_HELD_BYTES else MAX_HELD


class HeldDeletes:
    """A table's held DELETEs, in order; a key at most once."""

    __slots__ = ("keys", "rm", "rows")

    def __init__(self, rm: RelMap) -> None:
        self.rm = rm
        self.rows: list[_Held] = []
        self.keys: set[Hashable] = set()

    def put(
        self, key: Hashable, values: Sequence[bytes | None], kinds: bytes, ctx: Any, size: int
    ) -> int:
        """Hold a DELETE of ``key``; how many are held now, :data:`AGAIN` if ``key`` is.
        (``size`` is not counted: a DELETE holds a key, which a unique index bounds.)"""
        keys = self.keys
        if key in keys:
            return AGAIN
        keys.add(key)
        rows = self.rows
        rows.append((values, kinds, ctx))
        return len(rows)


#: A statement ready to send: (statement, parameters, formats, context).
Batch = tuple[Stmt, Params, Formats, MergedCtx]
Hold = HeldUpdates | HeldDeletes | FullHold


class UpdateMerger:
    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        #: Relation OID -> what the table holds (one kind at a time).
        self.tables: dict[int, Hold] = {}
        #: Mapping version -> column kinds -> SET shape (rows of one table share few).
        self._shapes: dict[int, dict[bytes, bytes]] = {}

    def _entry(self, rm: RelMap, kind: type[Hold]) -> Hold | None:
        """The table's holder of ``kind`` (made if it holds nothing); None if it
        holds another kind or another mapping version of the table."""
        oid = rm.relation.oid
        entry = self.tables.get(oid)
        if entry is None:
            entry = self.tables[oid] = kind(rm)
        elif entry.rm is not rm or type(entry) is not kind:
            return None
        return entry

    def add(self, rm: RelMap, change: Update, ctx: Any) -> int:
        """Hold ``change``; returns how many keys the table now holds, 0 if not held,
        :data:`AGAIN` if the table holds another kind of change.

        Not held (the caller sends it as usual, after :meth:`take` of its table):
        an UPDATE that changes the key, a key value that was not sent, or a table
        held under another mapping version.
        """
        if change.old is not None:
            return 0
        new = change.new.values
        size = sum(map(len, filter(None, new)))
        return self.hold_row(rm, HeldUpdates, new, change.new.kinds, ctx, size)

    def add_delete(self, rm: RelMap, change: Delete, ctx: Any) -> int:
        """Hold a DELETE by key; as :meth:`add` (:data:`AGAIN` also when the key is
        held already: the first DELETE goes out before the second looks for the row)."""
        return self.hold_row(rm, HeldDeletes, change.old.values, change.old.kinds, ctx, 0)

    def hold_row(
        self,
        rm: RelMap,
        kind: type[HeldUpdates | HeldDeletes],
        values: Sequence[bytes | None],
        kinds: bytes,
        ctx: Any,
        size: int,
    ) -> int:
        """Hold one row's values by key (for :meth:`add`, :meth:`add_delete` and the
        merge lane, which has no message object); returns as they do. ``size``: the
        values' bytes, or more (the lane gives its message's length, at no cost)."""
        # This runs per merged row: no generator, one dict lookup for the holder.
        idx = rm.key
        if _U in kinds and any(kinds[i] == _U for i in idx):
            return 0  # a key value that was not sent
        key = values[idx[0]] if len(idx) == 1 else tuple([values[i] for i in idx])
        oid = rm.relation.oid
        entry = self.tables.get(oid)
        if entry is None:
            entry = self.tables[oid] = kind(rm)
        elif type(entry) is not kind or entry.rm is not rm:
            return 0 if entry.rm is not rm else AGAIN
        assert isinstance(entry, (HeldUpdates, HeldDeletes))
        return entry.put(key, values, kinds, ctx, size)

    def add_full(self, rm: RelMap, change: Update | Delete, ctx: Any) -> int:
        """Hold a change of a REPLICA IDENTITY FULL table (:mod:`applier.apply.batching.fullident`);
        returns as :meth:`add`."""
        entry = self._entry(rm, FullHold)
        if not isinstance(entry, FullHold):
            return 0 if self.tables[rm.relation.oid].rm is not rm else AGAIN
        return entry.add(change, ctx)

    def holds(self, oid: int) -> bool:
        return oid in self.tables

    def take(self, oid: int) -> list[Batch]:
        """The statements for the rows held for one table (none left held)."""
        entry = self.tables.pop(oid, None)
        if entry is None:
            return []
        if isinstance(entry, HeldUpdates):
            return self._plan(entry.rm, entry.rows)
        if isinstance(entry, HeldDeletes):
            return self._plan_deletes(entry.rm, entry.rows)
        return [
            (stmt, params, fmts, MergedCtx(ctxs))
            for stmt, params, fmts, ctxs in entry.plan(self.planner)
        ]

    def take_all(self) -> list[Batch]:
        out: list[Batch] = []
        for oid in list(self.tables):
            out += self.take(oid)
        return out

    def discard(self) -> None:
        self.tables.clear()

    def forget(self, version: int) -> None:
        """Mapping ``version`` is gone (superseded or evicted): drop its shapes."""
        self._shapes.pop(version, None)

    # -- planning ----------------------------------------------------------------------

    def _plan(self, rm: RelMap, rows: dict[Hashable, _Held]) -> list[Batch]:
        shapes = self._shapes.get(rm.version)
        if shapes is None:
            shapes = self._shapes[rm.version] = {}
        by_shape: dict[bytes, list[_Held]] = {}
        for held in rows.values():
            kinds = held[1]
            shape = shapes.get(kinds)
            if shape is None:
                shape = shapes[kinds] = Planner.set_shape(rm, kinds)
            group = by_shape.get(shape)
            if group is None:
                by_shape[shape] = [held]
            else:
                group.append(held)
        out: list[Batch] = []
        for shape, group in by_shape.items():
            start = 0
            width = shape.count(1) + len(rm.key)
            for size in chunks(len(group), max_rows(width, MAX_HELD)):
                out.append(self._statement(rm, shape, group[start : start + size]))
                start += size
        return out

    def _statement(self, rm: RelMap, shape: bytes, rows: list[_Held]) -> Batch:
        stmt = self.planner.update_many(rm, shape, len(rows))
        return (stmt, *_params(rm, stmt.new_idx + stmt.where_idx, rows))

    def _plan_deletes(self, rm: RelMap, rows: list[_Held]) -> list[Batch]:
        out: list[Batch] = []
        start = 0
        for size in chunks(len(rows), max_rows(len(rm.key), MAX_HELD)):
            part = rows[start : start + size]
            start += size
            stmt = self.planner.delete_many(rm, size)
            out.append((stmt, *_params(rm, rm.key, part)))
        return out


def _params(
    rm: RelMap, cols: tuple[int, ...], rows: list[_Held]
) -> tuple[Params, Formats, MergedCtx]:
    """The values at ``cols`` of each row in one parameter list, their formats
    (None when all are text), and the rows' contexts."""
    # itemgetter and one join: this runs per held row of every merged statement.
    pick = itemgetter(*cols)
    if len(cols) == 1:
        params: Params = [pick(held[0]) for held in rows]
    else:
        params = list(chain.from_iterable([pick(held[0]) for held in rows]))
    fmts: Formats = None
    kinds = [held[1] for held in rows]
    if b"b" in b"".join(kinds):
        fmts = b"".join([param_formats(k, cols) for k in kinds])
    return params, fmts, MergedCtx([held[2] for held in rows], rm, lazy=True)
