"""Skip rules: what the worker must not apply, read from ``applier.skip_rules``.

After openGauss's ``GS_SQLAPPLY_SKIP`` (per replication origin): an *object*
rule skips a table pattern's changes (some operations or all); a *txn* rule
skips one source transaction, named by its xid or its finish LSN (the LSN of
its commit or prepare record, the one errors print), once: it is marked done in
the target transaction that records the skip and moves the origin past it; a
*ddl* rule skips one captured DDL statement (:mod:`applier.apply.handlers.ddl`),
named by the LSN of its ``applier.ddl`` message, once, the same way; an
*error* rule skips the changes that fail (on a table pattern, operations,
SQLSTATEs), and only those: the failed transaction is replayed with a savepoint
per change (the careful replay of :mod:`applier.apply.handlers.dispatch`), so the
fast path never pays for it.

Rules are managed with ``applier skip`` (:mod:`applier.skip`); the worker
reads the active ones at start and again every few seconds
(:data:`REFRESH_INTERVAL`), on its catalog connection, and compiles them per
table on first use (a table with no rule costs one flag test per change).

What a rule skipped is kept in ``applier.skipped_changes`` per its ``dump``:
``skipped`` (the skipped changes), ``all`` (the whole transaction, applied
changes marked ``skipped = false``) or ``none``; those rows are written in the
same target transaction as the skip, so a skip is never without its record.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from applier.apply.core.states import Txn
from applier.apply.sql.planner import Stmt
from applier.config import table_matches
from applier.lsn import Lsn, pg_timestamp

log = logging.getLogger("applier.apply")

#: Seconds between two reads of the rules by a running worker.
REFRESH_INTERVAL = 2.0

OPS = ("insert", "update", "delete", "truncate")


def _matches(pattern: str, qualname: str) -> bool:
    schema, _, table = qualname.partition(".")
    return table_matches(pattern, schema, table)


@dataclass(frozen=True, slots=True)
class Rule:
    id: int
    kind: str
    table_pattern: str | None
    ops: frozenset[str] | None
    xid: int | None
    lsn: Lsn | None
    sqlstates: frozenset[str] | None
    dump: str

    def covers(self, table: str, op: str) -> bool:
        """``table``: schema.name as the source named it (its first dot ends the schema;
        a schema name with a dot is matched as PostgreSQL quotes it nowhere here)."""
        return (self.table_pattern is None or _matches(self.table_pattern, table)) and (
            self.ops is None or op in self.ops
        )

    def describe(self) -> str:
        if self.kind == "ddl":
            return f"rule {self.id} (DDL statement at {self.lsn})"
        if self.kind == "txn":
            return f"rule {self.id} (transaction {self.xid if self.lsn is None else self.lsn})"
        return f"rule {self.id} ({self.kind} {self.table_pattern or '*.*'})"


@dataclass(frozen=True, slots=True)
class TableSkips:
    """One table's object rules by operation."""

    by_op: dict[str, Rule]


_SELECT = """
SELECT id, kind, table_pattern, ops, xid, lsn::text, sqlstates, dump
  FROM applier.skip_rules
 WHERE origin = %s AND NOT done
 ORDER BY id
"""


class SkipRules:
    """The active rules of one origin, compiled for the hot path."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.rules: tuple[Rule, ...] = ()
        #: Changes whenever the rules do (mappings compiled for an older one are stale).
        self.generation = 0
        self.has_object = False
        self.has_txn = False
        self.has_error = False
        self.dump_all = False
        self._tables: dict[str, TableSkips | None] = {}
        self._by_xid: dict[int, Rule] = {}
        self._by_lsn: dict[Lsn, Rule] = {}
        self._by_ddl_lsn: dict[Lsn, Rule] = {}

    def load(self, conn: psycopg.Connection[Any]) -> bool:
        """Read the active rules; True when they changed."""
        rows = conn.execute(_SELECT, (self.origin,)).fetchall()
        rules = tuple(
            Rule(
                int(r[0]),
                str(r[1]),
                r[2],
                frozenset(r[3]) if r[3] is not None else None,
                None if r[4] is None else int(r[4]),
                None if r[5] is None else Lsn.parse(r[5]),
                frozenset(r[6]) if r[6] is not None else None,
                str(r[7]),
            )
            for r in rows
        )
        if rules == self.rules:
            return False
        self._set(rules)
        log.info(
            "skip rules loaded",
            extra={"ctx": {"active": len(rules), "rules": [r.describe() for r in rules]}},
        )
        return True

    def _set(self, rules: tuple[Rule, ...]) -> None:
        self.rules = rules
        self.generation += 1
        self._tables.clear()
        self.has_object = any(r.kind == "object" for r in rules)
        self.has_error = any(r.kind == "error" for r in rules)
        self._by_xid = {r.xid: r for r in rules if r.kind == "txn" and r.xid is not None}
        self._by_lsn = {r.lsn: r for r in rules if r.kind == "txn" and r.lsn is not None}
        self.has_txn = bool(self._by_xid or self._by_lsn)
        self._by_ddl_lsn = {r.lsn: r for r in rules if r.kind == "ddl" and r.lsn is not None}
        self.dump_all = any(r.dump == "all" and r.kind != "txn" for r in rules)

    def done(self, rule: Rule) -> None:
        """A txn rule was used (its skip is committed or about to be): drop it here."""
        self._set(tuple(r for r in self.rules if r.id != rule.id))

    # -- matching ----------------------------------------------------------------------

    def txn_rule(self, xid: int, finish_lsn: Lsn) -> Rule | None:
        return self._by_lsn.get(finish_lsn) or self._by_xid.get(xid)

    def ddl_rule(self, lsn: Lsn) -> Rule | None:
        """The rule that skips the captured DDL statement whose message is at ``lsn``."""
        return self._by_ddl_lsn.get(lsn)

    def for_table(self, table: str) -> TableSkips | None:
        """The object rules of ``table`` (schema.name), None when there are none."""
        if table in self._tables:
            return self._tables[table]
        by_op: dict[str, Rule] = {}
        for r in self.rules:
            if r.kind == "object":
                for op in OPS:
                    if op not in by_op and r.covers(table, op):
                        by_op[op] = r
        hit = self._tables[table] = TableSkips(by_op) if by_op else None
        return hit

    def error_rule(self, table: str, op: str, sqlstate: str | None) -> Rule | None:
        """The first error rule that skips ``op`` on ``table`` failing with ``sqlstate``."""
        for r in self.rules:
            if (
                r.kind == "error"
                and r.covers(table, op)
                and (r.sqlstates is None or (sqlstate is not None and sqlstate in r.sqlstates))
            ):
                return r
        return None

    def may_catch(self, table: str | None, sqlstate: str | None) -> bool:
        """Whether some error rule could skip a failure like this one (any operation)."""
        for r in self.rules:
            if r.kind != "error":
                continue
            pattern = r.table_pattern
            if table is not None and pattern is not None and not _matches(pattern, table):
                continue
            if r.sqlstates is None or (sqlstate is not None and sqlstate in r.sqlstates):
                return True
        return False


@dataclass(slots=True)
class Kept:
    """A change kept in ``applier.skipped_changes``, written at its transaction's end."""

    ctx: Any  # the ChangeCtx (its rm for a TRUNCATE: the one relation)
    rule: Rule | None
    skipped: bool
    error: str | None = None
    sqlstate: str | None = None

    @property
    def no(self) -> int:
        return int(self.ctx.no)


@dataclass(slots=True)
class KeptDdl:
    """A captured DDL statement a rule skipped, written at its transaction's end (the
    statement kept unless the rule's dump is ``none``; a ddl rule marked done)."""

    rule: Rule
    lsn: Lsn
    no: int
    tag: str
    statement: str
    search_path: str
    table: tuple[str, str] | None


#: A skipped DDL statement's row (migration 0012: op 'ddl', the statement kept).
KEEP_DDL = Stmt(
    b"applier_skipped_ddl",
    b"INSERT INTO applier.skipped_changes (origin, rule_id, xid, commit_lsn, end_lsn, "
    b"change_lsn, change_no, commit_time, schema_name, table_name, op, skipped, new_row, "
    b"statement) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'ddl', true, $11, $12)",
    (25, 20, 20, 3220, 3220, 3220, 23, 1184, 25, 25, 3802, 25),
    (),
    (),
    False,
    False,
)


def ddl_params(origin: str, txn: Txn, k: KeptDdl, end_lsn: Lsn) -> list[bytes | None]:
    """KEEP_DDL's parameters: ``new_row`` holds the tag and the search_path it ran under."""
    schema, table = k.table or (None, None)
    kept = json.dumps({"tag": k.tag, "search_path": k.search_path}, ensure_ascii=False)
    return [
        origin.encode(),
        str(k.rule.id).encode(),
        str(txn.xid).encode(),
        str(Lsn(txn.commit_lsn)).encode(),
        str(Lsn(end_lsn)).encode(),
        str(Lsn(k.lsn)).encode(),
        str(k.no).encode(),
        pg_timestamp(txn.commit_ts).isoformat().encode() if txn.commit_ts else None,
        None if schema is None else schema.encode(),
        None if table is None else table.encode(),
        kept.encode(),
        k.statement.encode(),
    ]
