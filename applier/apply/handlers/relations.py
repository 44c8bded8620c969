"""The relation cache: Relation/Type messages and the target mappings built from them.

pgoutput sends a Relation message before the first change of a table in a
walsender session and again whenever the source's relation cache entry is
invalidated (an ALTER TABLE, but also unrelated invalidations, so most
repeats are identical). :class:`RelationCache` keeps the latest Relation and
Type messages and builds a :class:`~applier.apply.sql.mapping.RelMap` (a catalog
look-up on the target) when the first change of a relation needs one.

Bounded over months
===================

* A Relation message equal to the one in hand keeps its mapping (and so the
  prepared statements planned for it).
* A changed Relation message supersedes its mapping: the mapping's statements
  are handed to ``forget`` (the applier drops them from the planner and closes
  them on the target session), so a table altered a thousand times holds the
  statements of one shape, not a thousand.
* At most :data:`MAX_MAPPINGS` mappings are kept, the oldest built first out
  (rolling partitions: a dropped partition's mapping and statements go once
  newer ones pushed it out; the per-change path does not reorder, it is the
  hot path). The Relation messages themselves (a few hundred bytes each)
  stay: a change for an evicted relation rebuilds its mapping (a few catalog
  queries).

Errors
======

A change for a relation without a Relation message is a
:class:`~applier.errors.ProtocolError`. A catalog look-up that fails is a
:class:`~applier.errors.TransientError` when the connection broke, else an
:class:`~applier.errors.ApplyError`; both name the LSN, xid and table, and are
raised before anything of the transaction is committed.

The target is looked up once per mapping: a target table changed while the
worker runs (a trigger added, a column added to fix a mismatch) is seen when
the source sends a changed Relation message or the worker restarts.

Schema changes
==============

Two hooks the schema part (:mod:`applier.apply.handlers.schema`) sets: ``view``,
the catalog a mapping is looked up in (the apply session's own, while its open
transaction changed the schema, since the catalog connection sees only what is
committed), and with ``[schema] follow`` ``follow``, which says what to run on
the target for a relation it lags behind (:mod:`applier.apply.handlers.follow`);
those statements go through ``apply_schema`` (the seam) and the table is looked
up again. :meth:`RelationCache.forget_tables` drops the mappings a schema change
made stale.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

import psycopg

from applier.apply.rules.policies import Policies
from applier.apply.sql import mapping
from applier.apply.sql.ddlplan import SchemaStatement
from applier.apply.sql.mapping import Catalog, RelMap, TargetTable
from applier.config import Config
from applier.errors import ApplyError, ProtocolError, SchemaMismatch, TransientError
from applier.lsn import Lsn
from applier.protocol import Relation, Type

log = logging.getLogger("applier.apply")

#: Mappings kept at most (each holds a few prepared statements on the target).
MAX_MAPPINGS = 1000


def same_relation(known: Relation | None, m: Relation) -> bool:
    """Whether ``m`` describes the relation as ``known`` does (a Relation message
    inside a stream block carries its transaction's xid; that does not count)."""
    if known is None:
        return False
    return known == m or (known.xid != m.xid and dataclasses.replace(m, xid=known.xid) == known)


class RelationCache:
    """Relation and Type messages by OID, and the mappings built from them."""

    def __init__(
        self,
        cfg: Config,
        catalog: Catalog,
        forget: Callable[[RelMap], None] = lambda rm: None,
        limit: int = MAX_MAPPINGS,
    ) -> None:
        self.cfg = cfg
        self.catalog = catalog
        #: Called with a mapping that is superseded or evicted (its statements go).
        self.forget = forget
        self.limit = max(1, limit)
        self.policies = Policies(cfg.conflicts)
        self.relations: dict[int, Relation] = {}
        #: Built mappings, oldest first.
        self.relmaps: OrderedDict[int, RelMap] = OrderedDict()
        self.types: dict[int, tuple[str, str]] = {}
        #: The Relation message a changed one superseded (what a type was before).
        self.previous: dict[int, Relation] = {}
        #: The catalog mappings are looked up in (see "Schema changes").
        self.view: Callable[[], AbstractContextManager[Catalog]] = lambda: nullcontext(self.catalog)
        #: ``[schema] follow``: the statements that bring a target table up to a
        #: Relation message (none: it is up to it), and the seam that runs them.
        self.follow: Follow | None = None
        self.apply_schema: Callable[[Lsn, Sequence[SchemaStatement]], None] = _no_seam

    def on_relation(self, m: Relation) -> bool:
        """Record a Relation message; False when it equals the one in hand (mapping kept)."""
        if same_relation(self.relations.get(m.oid), m):
            return False
        known = self.relations.get(m.oid)
        if known is not None:
            self.previous[m.oid] = known
        self.relations[m.oid] = m
        old = self.relmaps.pop(m.oid, None)
        if old is not None:
            self.forget(old)
        return True

    def on_type(self, m: Type) -> None:
        # pgoutput writes pg_catalog as the empty string.
        self.types[m.oid] = (m.namespace or "pg_catalog", m.name)

    def get(self, oid: int, lsn: Lsn, xid: int | None) -> RelMap:
        """The mapping of relation ``oid`` (built on first use)."""
        relmaps = self.relmaps
        rm = relmaps.get(oid)
        if rm is not None:
            return rm
        rel = self.relations.get(oid)
        if rel is None:
            raise ProtocolError(
                f"change for relation {oid} before its Relation message",
                lsn=str(Lsn(lsn)),
                xid=xid,
                hint="the stream is out of order; applier run restarts from the origin",
            )
        rm = self._build(rel, lsn, xid)
        relmaps[oid] = rm
        while len(relmaps) > self.limit:
            _, evicted = relmaps.popitem(last=False)
            self.forget(evicted)
        return rm

    def _build(self, rel: Relation, lsn: Lsn, xid: int | None) -> RelMap:
        if not self.cfg.tables.includes(rel.namespace, rel.name):
            return mapping.skipped(rel)
        table = f"{rel.namespace}.{rel.name}"
        try:
            rm = self._looked_up(rel, lsn)
        except SchemaMismatch as e:
            e.context.update({"lsn": str(Lsn(lsn)), "xid": xid})
            raise
        except psycopg.OperationalError as e:
            raise TransientError(
                f"catalog lookup failed: {str(e).strip()}",
                lsn=str(Lsn(lsn)),
                xid=xid,
                table=table,
            ) from None
        except psycopg.Error as e:
            raise ApplyError(
                f"looking up table {table} on the target failed: {str(e).strip()}",
                lsn=str(Lsn(lsn)),
                xid=xid,
                table=table,
                sqlstate=e.sqlstate,
                hint="check the applier role's privileges on the target's catalog and table",
            ) from None
        log.info(
            "table mapped",
            extra={
                "ctx": {
                    "table": rm.qualname,
                    "columns": len(rel.columns),
                    "replident": rel.replident,
                }
            },
        )
        return rm

    def _looked_up(self, rel: Relation, lsn: Lsn) -> RelMap:
        """The mapping of ``rel``, after bringing its target table up to it (follow)."""
        with self.view() as catalog:
            target = catalog.table(rel.namespace, rel.name)
            if self.follow is None or target is None:
                return self._map(rel, catalog, target)
        # Outside the view: follow and the seam use the session themselves.
        changes = self.follow(rel, self.previous.get(rel.oid), target)
        if changes:
            self.apply_schema(lsn, changes)
        with self.view() as catalog:
            if changes:
                target = catalog.table(rel.namespace, rel.name)
            return self._map(rel, catalog, target)

    def forget_tables(self, tables: set[tuple[str, str]] | None) -> None:
        """Drop the mappings of ``tables`` (schema, name), or all: the next change of
        each is mapped again, against the target's catalog as it is now."""
        for oid, rm in list(self.relmaps.items()):
            rel = rm.relation
            if tables is None or (rel.namespace, rel.name) in tables:
                del self.relmaps[oid]
                self.forget(rm)

    def _map(self, rel: Relation, catalog: Catalog, target: TargetTable | None) -> RelMap:
        accepts = None
        if target is not None:
            binary = self.cfg.apply.binary
            if binary:
                _refuse_binary_doubts(catalog, rel, target)
            accepts = {
                i: catalog.accepts(
                    c.type_oid,
                    self.types.get(c.type_oid),
                    target.columns[c.name].type_oid,
                    binary,
                )
                for i, c in enumerate(rel.columns)
                if c.name in target.columns
            }
        names = dict(self.types)
        for c in rel.columns:
            if c.type_oid < mapping.FIRST_NORMAL_OID:
                names[c.type_oid] = catalog.type_name(c.type_oid)
        rm = mapping.build(
            rel,
            target,
            accepts,
            names,
            lambda c: catalog.source_type_sql(c, self.types.get(c.type_oid)),
        )
        policy = self.policies.for_table(rel.namespace, rel.name)
        if policy.builtin:
            return rm
        # Per-row decisions: COPY runs and multi-row INSERTs cannot make them, and merged
        # UPDATEs could not (see applier.apply.rules.policies); the statements are per change.
        return dataclasses.replace(rm, policy=policy, merge=rm.merge and policy.merge)


#: What ``[schema] follow`` plugs in: the statements that bring ``target`` up to the
#: Relation message (given the one it superseded, if known), or none.
Follow = Callable[[Relation, Relation | None, TargetTable], Sequence[SchemaStatement]]


def _no_seam(lsn: Lsn, changes: Sequence[SchemaStatement]) -> None:
    raise AssertionError("internal error: a schema change without the schema part")


def _refuse_binary_doubts(catalog: Catalog, rel: Relation, target: mapping.TargetTable) -> None:
    """``[apply] binary`` cannot send one column as text: refuse the columns whose
    binary values the target may refuse or misread (see Catalog.binary_in_doubt)."""
    for c in rel.columns:
        tc = target.columns.get(c.name)
        if tc is not None and catalog.binary_in_doubt(tc.type_oid):
            name = f"{rel.namespace}.{rel.name}"
            raise SchemaMismatch(
                f"table {name}: column {c.name!r} has type {tc.type_sql}, which holds a "
                "user-defined composite type: its binary values are read by the target's "
                "member types, unchecked",
                table=name,
                column=c.name,
                hint="set [apply] binary = false (every value then travels as text) and "
                "restart applier run",
            )
