"""The write set of a transaction: hashed row keys, written and read, or a barrier.

Keys
====

A key is ``hash((kid, values))``: ``kid`` a small number the leader's
:class:`KeySpace` gives each (target table, sorted column names), ``values``
the bytes the source sent for those columns (one value, or a tuple of them, in
sorted-name order). The same columns of the same target table therefore hash
alike whichever change they come from: the replica identity of an UPDATE, the
primary key of an INSERT, and a child's foreign key pointing at that primary
key (the parent's columns name the key, the child's values fill it). A hash
collision makes two transactions wait for each other needlessly, never run two
conflicting ones at once; Python's bytes cache their hash, so a key costs one
tuple and one hash (``bench/writeset_bench.py``: 0.2-0.8 µs of CPU a change
where the identity is the table's only key, as in pgbench; ~2 µs with a unique
index and a foreign key besides).

Values are compared as the source spelt them. For a row's own identity that
is exact (the source's output function gives the same bytes for the same
stored value); across columns (a foreign key between ``int4`` and ``int8``,
binary format) it is not, so such a foreign key is not keyed, and is a barrier
where its checks fire on the target (:mod:`.tablekeys`).

Per change
==========

* **INSERT** writes a key for every keyable unique index of the target and
  the replica identity (a NULL in an index whose NULLs are distinct collides
  with nothing: no key); reads its table's key and, for each foreign key, the
  parent's key and the parent table's key (NULL in it: no check, no key).
* **UPDATE** writes the keys of the new row and of the old one: the old key
  when the identity changed (``K``), every index from the whole old row
  (``O``, REPLICA IDENTITY FULL); reads as INSERT does. A unique index whose old
  values the source did not send (its columns are not all in the identity,
  and the old row is not whole) could have moved a value unseen: the change
  *writes the table's key* instead. So does an unchanged TOAST value in a key.
* **DELETE** writes the old row's keys, by the same rules.
* **TRUNCATE**, a captured DDL message (:data:`DDL_PREFIX`), a table whose
  target fires triggers or rules (unless trusted), and whatever the leader
  marks (:meth:`Collector.mark`) make the transaction a barrier.

A table whose rows cannot be keyed at all (no usable unique index and FULL
identity, an exclusion constraint, a partial or expression unique index, a
unique column the source does not send) has every change write its table key:
it is ordered against every transaction that touches that table, and only
those. A child's DELETE (or an UPDATE away from a parent) reads nothing of the
parent: its old row sends only the child's own key. So a parent's DELETE in a
later transaction is not ordered after its children's DELETE in an earlier one;
if it runs first on the target where the foreign key is checked, it is refused
(23503) and its member applies it again after the earlier one has committed
(:mod:`.member`), which is correct and costs one retry
(``test_a_parent_deleted_after_its_children_is_applied_again_after_them``).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

from applier.apply.parallel.tablekeys import TargetKeys
from applier.apply.sql.mapping import RelMap
from applier.ddl.message import PREFIX as DDL_PREFIX
from applier.protocol import Delete, Insert, Message, TupleData, Update

#: ``kinds[i]`` of an unchanged TOAST value (its bytes were not sent).
_U = ord("u")
#: What :meth:`KeyCols.key` returns for a key whose value was not sent. Python's
#: ``hash`` never returns -1 (CPython maps it to -2), so no key is mistaken for it.
UNKNOWN = -1


class KeySpace:
    """Numbers for (target table, sorted column names): the leader's, one per process.

    It grows by the tables and indexes met (a few per table), not by rows.
    """

    def __init__(self) -> None:
        self._ids: dict[tuple[int, tuple[str, ...]], int] = {}

    def id(self, oid: int, names: tuple[str, ...]) -> int:
        kid = self._ids.get((oid, names))
        if kid is None:
            kid = self._ids[(oid, names)] = len(self._ids) + 1
        return kid

    def table(self, oid: int) -> int:
        """The key of a whole table: every row change reads it; an unkeyable one writes it."""
        return hash((self.id(oid, ()),))


class KeyCols:
    """One key of a table: its number and the source columns that fill it."""

    __slots__ = ("get", "idx", "kid", "multi", "nulls_collide")

    def __init__(self, kid: int, idx: tuple[int, ...], nulls_collide: bool = False) -> None:
        self.kid = kid
        self.idx = idx
        self.multi = len(idx) > 1
        self.nulls_collide = nulls_collide
        #: values -> the key's value (one column) or values (a tuple).
        self.get = itemgetter(*idx)

    def key(self, tup: TupleData, unsent: bool) -> int | None:
        """The key of ``tup``'s values; None when NULLs make it collide with nothing;
        :data:`UNKNOWN` when a value was not sent (``unsent``: the tuple has some)."""
        if unsent and any(tup.kinds[i] == _U for i in self.idx):
            return UNKNOWN
        v = self.get(tup.values)
        if not self.nulls_collide and (None in v if self.multi else v is None):
            return None
        return hash((self.kid, v))


@dataclass(frozen=True, slots=True)
class TableKeys:
    """A mapping's keys, compiled once per mapping version (see the module doc)."""

    #: The table's changes take part (an excluded table's changes are not applied).
    included: bool = False
    #: Why every change of this table is a barrier (None: keyed).
    barrier: str | None = None
    #: Its whole-table key.
    table: int = 0
    #: Every change writes the table key (no row can be keyed).
    wide: bool = False
    #: The keyable unique indexes and the replica identity, each once.
    sets: tuple[KeyCols, ...] = ()
    #: The replica identity's key (DEFAULT or INDEX identity), one of ``sets``.
    ident: KeyCols | None = None
    #: Some unique index has columns outside the identity: an UPDATE or DELETE
    #: without the whole old row cannot key its old values.
    partial_old: bool = False
    #: The parents' keys a new row reads, and the parents' table keys.
    parents: tuple[KeyCols, ...] = ()
    parent_tables: frozenset[int] = frozenset()
    #: Why a new row of this table is a barrier: a firing foreign key it cannot key.
    fk_barrier: str | None = None
    #: The identity's key when it is the table's only key (no other unique index,
    #: no foreign key, keyable): the common case, keyed without the general loop.
    simple: KeyCols | None = None

    @classmethod
    def build(
        cls,
        rm: RelMap,
        keys: TargetKeys,
        space: KeySpace,
        trust_triggers: bool = False,
    ) -> TableKeys:
        """``rm``'s keys from its target's unique indexes and foreign keys (:mod:`.tablekeys`).

        ``trust_triggers``: the operator says the target's triggers on this table
        touch only the row they fire for (else they make its changes barriers).
        """
        target = rm.target
        if not rm.included or target is None:
            return cls()
        table = space.table(target.oid)
        if target.observed and not trust_triggers:
            why = f"table {rm.qualname}: a trigger or rule fires on the target"
            return cls(True, why, table)
        src = {c.name: i for i, c in enumerate(rm.relation.columns)}
        wide = False
        sets: dict[int, KeyCols] = {}
        for u in keys.unique:
            if not u.keyable or any(c not in src for c in u.columns):
                wide = True
                continue
            names = tuple(sorted(u.columns))
            kid = space.id(target.oid, names)
            sets[kid] = KeyCols(kid, tuple(src[n] for n in names), u.nulls_collide)
        ident = None
        if rm.replident in "di" and rm.key:
            names = tuple(sorted(rm.relation.columns[i].name for i in rm.key))
            kid = space.id(target.oid, names)
            ident = sets.setdefault(kid, KeyCols(kid, tuple(src[n] for n in names)))
        known = set(ident.idx) if ident is not None else set()
        partial_old = any(not set(s.idx) <= known for s in sets.values())
        parents, parent_tables, fk_barrier = _parents(rm, keys, space, src)
        only = ident is not None and len(sets) == 1 and not wide and not parents
        simple = ident if only and fk_barrier is None else None
        return cls(
            True, None, table, wide, tuple(sets.values()), ident, partial_old,
            parents, parent_tables, fk_barrier, simple,
        )  # fmt: skip


def _parents(
    rm: RelMap, keys: TargetKeys, space: KeySpace, src: dict[str, int]
) -> tuple[tuple[KeyCols, ...], frozenset[int], str | None]:
    """The parent keys a new row of ``rm`` reads; why it is a barrier, if it is."""
    parents: list[KeyCols] = []
    tables: set[int] = set()
    barrier = None
    for fk in keys.foreign:
        if not fk.same_types or any(c not in src for c, _ in fk.pairs):
            # Not keyable (bytes differ for equal values, or the target fills the
            # column): harmless unless its check fires on the target.
            if fk.fires:
                barrier = f"table {rm.qualname}: a foreign key checked on the target, not keyable"
            continue
        pairs = sorted(fk.pairs, key=lambda p: p[1])
        kid = space.id(fk.parent, tuple(p for _, p in pairs))
        parents.append(KeyCols(kid, tuple(src[c] for c, _ in pairs)))
        tables.add(space.table(fk.parent))
    return tuple(parents), frozenset(tables), barrier


@dataclass(frozen=True, slots=True)
class WriteSet:
    """What one transaction writes and reads, or why it is a barrier."""

    writes: frozenset[int] = frozenset()
    reads: frozenset[int] = frozenset()
    barrier: str | None = None

    def conflicts(self, other: WriteSet) -> bool:
        """Whether the two may not run at once (a barrier conflicts with everything)."""
        if self.barrier is not None or other.barrier is not None:
            return True
        w, ow = self.writes, other.writes
        return not (w.isdisjoint(ow) and w.isdisjoint(other.reads) and ow.isdisjoint(self.reads))


class Collector:
    """The write set of the transaction in hand: the leader adds each change to it."""

    __slots__ = ("barrier", "reads", "writes")

    def __init__(self) -> None:
        self.writes: set[int] = set()
        self.reads: set[int] = set()
        self.barrier: str | None = None

    def mark(self, why: str) -> None:
        """Make the transaction a barrier (the first reason is kept)."""
        if self.barrier is None:
            self.barrier = why

    def take(self) -> WriteSet:
        """The transaction's write set; the collector starts empty for the next one."""
        ws = WriteSet(frozenset(self.writes), frozenset(self.reads - self.writes), self.barrier)
        self.writes, self.reads, self.barrier = set(), set(), None
        return ws

    # -- changes -------------------------------------------------------------------

    def insert(self, tk: TableKeys, change: Insert) -> None:
        simple = tk.simple
        if simple is not None:
            # An identity is never NULL (a primary key, or a NOT NULL index).
            self.writes.add(hash((simple.kid, simple.get(change.new.values))))
            self.reads.add(tk.table)
            return
        if not tk.included:
            return
        if tk.barrier is not None:
            self.mark(tk.barrier)
            return
        new = change.new
        writes = self.writes
        for s in tk.sets:
            k = s.key(new, False)
            if k is not None:
                writes.add(k)
        (writes if tk.wide else self.reads).add(tk.table)
        if tk.parents or tk.fk_barrier:
            self._parents(tk, new, False)

    def update(self, tk: TableKeys, change: Update) -> None:
        simple = tk.simple
        new, old = change.new, change.old
        if simple is not None and _U not in new.kinds and (old is None or change.old_kind == "K"):
            writes = self.writes
            writes.add(hash((simple.kid, simple.get(new.values))))
            if old is not None:
                writes.add(hash((simple.kid, simple.get(old.values))))
            self.reads.add(tk.table)
            return
        if not tk.included:
            return
        if tk.barrier is not None:
            self.mark(tk.barrier)
            return
        unsent = _U in new.kinds
        wide = self._add(tk.sets, new, unsent) or tk.wide
        if old is None:
            # The identity did not change (its key is the new row's): the other
            # indexes' old values were not sent.
            wide = wide or tk.partial_old or tk.ident is None
        elif change.old_kind == "O":
            wide = self._add(tk.sets, old, _U in old.kinds) or wide or not tk.sets
        else:
            wide = self._old_key(tk, old) or wide
        (self.writes if wide else self.reads).add(tk.table)
        if tk.parents or tk.fk_barrier:
            self._parents(tk, new, unsent)

    def delete(self, tk: TableKeys, change: Delete) -> None:
        simple = tk.simple
        if simple is not None and change.old_kind == "K":
            self.writes.add(hash((simple.kid, simple.get(change.old.values))))
            self.reads.add(tk.table)
            return
        if not tk.included:
            return
        if tk.barrier is not None:
            self.mark(tk.barrier)
            return
        old = change.old
        if change.old_kind == "O":
            wide = self._add(tk.sets, old, _U in old.kinds) or tk.wide or not tk.sets
        else:
            wide = self._old_key(tk, old) or tk.wide
        (self.writes if wide else self.reads).add(tk.table)

    def truncate(self) -> None:
        """TRUNCATE empties whole tables (and may restart their sequences): a barrier."""
        self.mark("TRUNCATE")

    def message(self, m: Message) -> None:
        """A captured DDL statement (issue 33) runs in the transaction: a barrier."""
        if m.transactional and m.prefix == DDL_PREFIX:
            self.mark("a schema change")

    # -- helpers -------------------------------------------------------------------

    def _add(self, sets: tuple[KeyCols, ...], tup: TupleData, unsent: bool) -> bool:
        """Write the keys of ``tup``; True when one of them was not sent (write the table)."""
        writes = self.writes
        unknown = False
        for s in sets:
            k = s.key(tup, unsent)
            if k == UNKNOWN:
                unknown = True
            elif k is not None:
                writes.add(k)
        return unknown

    def _old_key(self, tk: TableKeys, old: TupleData) -> bool:
        """Write the identity key of an old key tuple (``K``); True: write the table."""
        ident = tk.ident
        if ident is None:
            return True
        k = ident.key(old, _U in old.kinds)
        if k == UNKNOWN:
            return True
        if k is not None:
            self.writes.add(k)
        return tk.partial_old

    def _parents(self, tk: TableKeys, new: TupleData, unsent: bool) -> None:
        if tk.fk_barrier is not None:
            self.mark(tk.fk_barrier)
        reads = self.reads
        for p in tk.parents:
            k = p.key(new, unsent)
            # Unsent: the foreign key did not change, and no check runs for it.
            if k is not None and k != UNKNOWN:
                reads.add(k)
        reads.update(tk.parent_tables)
