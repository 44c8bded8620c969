"""Skip rules and kept changes on the target: the operator's side of ``applier skip``.

The worker decides what to skip; this module only manages what it reads and
reads what it kept. Both live in the target's ``applier`` schema (migration
0006 is the contract), per replication origin (``cfg.origin``), so several
appliers writing into one target keep separate rules:

* ``applier.skip_rules``: one row per rule. :func:`new_rule` turns the command
  line into a :class:`NewRule` and refuses anything the table's CHECKs would
  refuse (or that the worker could not use) with a :class:`ConfigError` that
  says what to write instead, before any connection is opened: bad input
  exits 2 and writes nothing. Exactly one kind per rule: ``object`` (a table
  pattern in ``[tables]`` syntax, optionally some operations), ``txn`` (one
  transaction by xid or finish LSN; the worker uses it once and marks it
  ``done``), ``ddl`` (one captured DDL statement by its message's LSN, used
  once too; migration 0012) or ``error`` (changes that fail, optionally only some SQLSTATEs,
  tables, operations). ``--dump`` defaults to ``skipped`` for object and error
  rules and ``all`` for transaction rules, as the issue asks. Adding a rule
  identical to an active one returns the existing id (running a printed
  command twice makes one rule).
* ``applier.skipped_changes``: what the worker kept of skipped transactions.
  :func:`kept_changes` reads them in replay order (commit LSN, change number);
  :mod:`applier.skip.dump` prints them as SQL.

Writers bring the schema to head first (as ``run`` does: alembic only when it
is behind). Readers never write: a target without the tables has no rules and
no kept changes. A rule's removal leaves its kept changes (the foreign key is
``ON DELETE SET NULL``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

import psycopg
from psycopg.rows import dict_row

from .. import pgconn
from ..config import Config, check_table_pattern
from ..errors import ConfigError, PermanentError, TransientError
from ..lsn import Lsn
from ..origingroup import progress_sql
from ..redact import redact_dsn

KINDS = ("object", "txn", "error", "ddl")
OPS = ("insert", "update", "delete", "truncate")
DUMPS = ("none", "skipped", "all")
DEFAULT_DUMP = {"object": "skipped", "txn": "all", "error": "skipped", "ddl": "skipped"}
MAX_XID = 2**32 - 1
_SQLSTATE = re.compile(r"^[0-9A-Z]{5}$")


@dataclass(frozen=True)
class NewRule:
    """A validated rule, not yet written."""

    kind: str
    dump: str
    table: str | None = None
    ops: tuple[str, ...] | None = None
    xid: int | None = None
    lsn: Lsn | None = None
    sqlstates: tuple[str, ...] | None = None


def parse_ops(text: str) -> tuple[str, ...]:
    """``'insert,update'`` -> ``('insert', 'update')``, each once, in the given order."""
    ops = [o.strip().lower() for o in text.split(",")]
    bad = [o for o in ops if o not in OPS]
    if not text.strip() or bad:
        raise ConfigError(
            f"--op {text!r}: unknown operation {', '.join(map(repr, bad)) or '(none)'}",
            hint="write a comma-separated list of " + ", ".join(OPS),
        )
    return tuple(dict.fromkeys(ops))


def parse_sqlstates(text: str) -> tuple[str, ...]:
    """``'23505,23503'`` -> ``('23505', '23503')``; five characters, digits or capitals."""
    codes = [c.strip().upper() for c in text.split(",")]
    bad = [c for c in codes if not _SQLSTATE.match(c)]
    if not text.strip() or bad:
        raise ConfigError(
            f"--sqlstate {text!r}: {', '.join(map(repr, bad)) or '(none)'} is not a SQLSTATE",
            hint="write five-character codes separated by commas, e.g. 23505,23503 "
            "(see PostgreSQL's 'Errcodes' appendix)",
        )
    return tuple(dict.fromkeys(codes))


def check_xid(xid: int) -> int:
    if not 0 <= xid <= MAX_XID:
        raise ConfigError(
            f"--xid {xid}: a transaction id is between 0 and {MAX_XID}",
            hint="give the 32-bit xid as the apply error or `applier skip dump` prints it",
        )
    return xid


def new_rule(
    *,
    table: str | None = None,
    ops: str | None = None,
    xid: int | None = None,
    lsn: Lsn | None = None,
    error: bool = False,
    sqlstates: str | None = None,
    dump: str | None = None,
    ddl_lsn: Lsn | None = None,
) -> NewRule:
    """The rule the options describe, or a :class:`ConfigError` saying what is wrong."""
    if ddl_lsn is not None:
        return _ddl_rule(
            ddl_lsn, bool(table or ops or xid is not None or lsn or error or sqlstates), dump
        )
    kind = _kind(table=table, xid=xid, lsn=lsn, error=error)
    if kind == "txn" and (table or ops or sqlstates):
        raise ConfigError(
            "a transaction rule (--xid/--lsn) skips the whole transaction: "
            "--table, --op and --sqlstate do not apply to it",
            hint="drop them, or add an object rule (--table) or an error rule (--error)",
        )
    if sqlstates is not None and kind != "error":
        raise ConfigError(
            "--sqlstate only goes with --error", hint="add --error to skip changes that fail"
        )
    if table is not None:
        try:
            check_table_pattern(table)
        except ValueError as e:
            raise ConfigError(f"--table: {e}", hint="quote the pattern for the shell") from None
    if lsn is not None and lsn == 0:
        raise ConfigError(
            "--lsn 0/0 is no transaction's LSN",
            hint="copy the finish LSN the apply error or `applier status` prints",
        )
    if dump is not None and dump not in DUMPS:
        raise ConfigError(f"--dump {dump!r}: expected one of " + ", ".join(DUMPS))
    return NewRule(
        kind=kind,
        dump=dump or DEFAULT_DUMP[kind],
        table=table,
        ops=parse_ops(ops) if ops is not None else None,
        xid=check_xid(xid) if xid is not None else None,
        lsn=lsn,
        sqlstates=parse_sqlstates(sqlstates) if sqlstates is not None else None,
    )


def _ddl_rule(lsn: Lsn, more: bool, dump: str | None) -> NewRule:
    """``--ddl-lsn``: one captured statement, by its message's LSN, and nothing else."""
    if more:
        raise ConfigError(
            "--ddl-lsn skips one captured DDL statement: --table, --op, --xid, --lsn, "
            "--error and --sqlstate do not go with it",
            hint="give --ddl-lsn alone (with --dump none|skipped if needed)",
        )
    if lsn == 0:
        raise ConfigError(
            "--ddl-lsn 0/0 is no message's LSN",
            hint="copy the LSN the worker's stop on the DDL statement prints",
        )
    if dump not in (None, "none", "skipped"):
        raise ConfigError(
            f"--dump {dump}: a DDL rule keeps the statement it skips (skipped) or nothing (none)"
        )
    return NewRule(kind="ddl", dump=dump or DEFAULT_DUMP["ddl"], lsn=lsn)


def _kind(*, table: str | None, xid: int | None, lsn: Lsn | None, error: bool) -> str:
    if xid is not None and lsn is not None:
        raise ConfigError(
            "--xid and --lsn both name a transaction: give one",
            hint="--lsn (the finish LSN the error and `applier status` print) is exact; "
            "an xid can repeat after wraparound",
        )
    txn = xid is not None or lsn is not None
    if txn and error:
        raise ConfigError(
            "--error and --xid/--lsn are two kinds of rule: give one per `skip add`",
        )
    if txn:
        return "txn"
    if error:
        return "error"
    if table is not None:
        return "object"
    raise ConfigError(
        "say what to skip: --table PATTERN (an object), --xid N or --lsn LSN "
        "(one transaction), or --error (changes that fail)",
        hint="see `applier skip add --help`",
    )


@dataclass
class Rule:
    """A rule as stored, with how many kept changes name it."""

    id: int
    kind: str
    table: str | None
    op: list[str] | None
    xid: int | None
    lsn: str | None
    sqlstate: list[str] | None
    dump: str
    created_at: dt.datetime
    done: bool
    done_at: dt.datetime | None
    done_end_lsn: str | None
    done_gid: str | None
    kept: int

    def as_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("created_at", "done_at"):
            d[k] = d[k].isoformat() if d[k] is not None else None
        return d


# --- the target --------------------------------------------------------------


@contextmanager
def target(cfg: Config, *, write: bool) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the target; for writers, the schema at head first.

    Every psycopg error becomes an :class:`ApplierError` (no traceback reaches
    the operator): a lost or refused connection is transient (exit 1), any
    other refusal (privileges, say) permanent (exit 3).
    """
    conninfo = cfg.target.conninfo()
    with _target_errors(conninfo):
        conn = pgconn.connect(conninfo, side="target", purpose="applier skip")
    try:
        if write:
            from ..schema import schema_at_head, upgrade_target

            if not schema_at_head(conn):
                upgrade_target(conninfo)
        with _target_errors(conninfo):
            yield conn
    finally:
        conn.close()


@contextmanager
def _target_errors(conninfo: str) -> Iterator[None]:
    try:
        yield
    except psycopg.OperationalError as e:
        raise TransientError(
            f"target ({redact_dsn(conninfo)}): {_first_line(e)}",
            hint="check [target] dsn and that the server is up",
        ) from None
    except psycopg.Error as e:
        raise PermanentError(
            f"the target refused: {_first_line(e)}",
            hint="the config's target role needs to read and write the applier schema",
            sqlstate=e.sqlstate,
        ) from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def has_tables(conn: psycopg.Connection[Any]) -> bool:
    """Whether the target has the skip tables (migration 0006) at all."""
    row = conn.execute(
        "SELECT pg_catalog.to_regclass('applier.skip_rules') IS NOT NULL "
        "AND pg_catalog.to_regclass('applier.skipped_changes') IS NOT NULL"
    ).fetchone()
    return bool(row and row[0])


# --- rules -------------------------------------------------------------------

_SAME_RULE = """
SELECT id FROM applier.skip_rules
 WHERE origin = %(origin)s AND NOT done AND kind = %(kind)s AND dump = %(dump)s
   AND table_pattern IS NOT DISTINCT FROM %(table)s
   AND ops IS NOT DISTINCT FROM %(ops)s::text[]
   AND xid IS NOT DISTINCT FROM %(xid)s::bigint
   AND lsn IS NOT DISTINCT FROM %(lsn)s::pg_lsn
   AND sqlstates IS NOT DISTINCT FROM %(sqlstates)s::text[]
 ORDER BY id LIMIT 1
"""

_INSERT_RULE = """
INSERT INTO applier.skip_rules (origin, kind, table_pattern, ops, xid, lsn, sqlstates, dump)
VALUES (%(origin)s, %(kind)s, %(table)s, %(ops)s::text[], %(xid)s::bigint, %(lsn)s::pg_lsn,
        %(sqlstates)s::text[], %(dump)s)
RETURNING id
"""


def add_rule(conn: psycopg.Connection[Any], origin: str, rule: NewRule) -> tuple[int, bool]:
    """Write ``rule`` for ``origin``: ``(id, True)``, or ``(id, False)`` when an
    identical active rule existed already (its id)."""
    params = {
        "origin": origin,
        "kind": rule.kind,
        "dump": rule.dump,
        "table": rule.table,
        "ops": list(rule.ops) if rule.ops is not None else None,
        "xid": rule.xid,
        "lsn": str(rule.lsn) if rule.lsn is not None else None,
        "sqlstates": list(rule.sqlstates) if rule.sqlstates is not None else None,
    }
    with conn.transaction():
        # One writer at a time per origin, so two identical adds make one rule.
        conn.execute(
            "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext(%s))",
            (f"applier skip rules {origin}",),
        )
        row = conn.execute(_SAME_RULE, params).fetchone()
        if row is not None:
            return int(row[0]), False
        row = conn.execute(_INSERT_RULE, params).fetchone()
    assert row is not None
    return int(row[0]), True


def applied_past(conn: psycopg.Connection[Any], origin: str, lsn: Lsn) -> Lsn | None:
    """The origin's progress when it is past ``lsn`` (that transaction was applied)."""
    # With parallel apply the group's largest progress (applier.origingroup).
    row = conn.execute(f"SELECT {progress_sql(flushed=False)}::text", (origin,)).fetchone()
    if not row or row[0] is None:
        return None
    progress = Lsn.parse(row[0])
    return progress if progress > lsn else None


_LIST_RULES = """
SELECT r.id, r.kind, r.table_pattern AS table, r.ops AS op, r.xid, r.lsn::text AS lsn,
       r.sqlstates AS sqlstate, r.dump, r.created_at, r.done, r.done_at,
       r.done_end_lsn::text AS done_end_lsn, r.done_gid,
       (SELECT count(*) FROM applier.skipped_changes k WHERE k.rule_id = r.id) AS kept
  FROM applier.skip_rules r
 WHERE r.origin = %s AND (NOT %s OR NOT r.done)
 ORDER BY r.id
"""


def list_rules(conn: psycopg.Connection[Any], origin: str, *, active_only: bool) -> list[Rule]:
    if not has_tables(conn):
        return []
    rows = conn.cursor(row_factory=dict_row).execute(_LIST_RULES, (origin, active_only))
    return [Rule(**r) for r in rows.fetchall()]


def remove_rule(conn: psycopg.Connection[Any], origin: str, rule_id: int) -> int:
    """Delete rule ``rule_id`` of ``origin``; the number of kept changes it leaves behind."""
    with conn.transaction():
        kept = conn.execute(
            "SELECT count(*) FROM applier.skipped_changes WHERE origin = %s AND rule_id = %s",
            (origin, rule_id),
        ).fetchone()
        row = conn.execute(
            "DELETE FROM applier.skip_rules WHERE origin = %s AND id = %s RETURNING id",
            (origin, rule_id),
        ).fetchone()
    if row is None:
        raise ConfigError(
            f"no skip rule {rule_id} for origin {origin!r}",
            hint="`applier skip list --config F` shows the rules and their ids",
        )
    return int(kept[0]) if kept else 0


def render_rules(rules: list[Rule], out: TextIO, *, origin: str, as_json: bool) -> None:
    """``skip list``: a JSON array, or a table for people."""
    if as_json:
        json.dump([r.as_json() for r in rules], out, indent=2)
        out.write("\n")
        return
    if not rules:
        out.write(f"no skip rules for origin {origin}\n")
        return
    # Plain aligned columns, never wrapped: patterns and LSNs stay whole to copy.
    head = ("id", "kind", "what", "dump", "kept", "created", "state")
    rows = [
        (str(r.id), r.kind, _what(r), r.dump, str(r.kept), _minute(r.created_at), _state(r))
        for r in rules
    ]
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    for line in [head, *rows]:
        out.write("  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip() + "\n")


def _what(r: Rule) -> str:
    parts = []
    if r.xid is not None:
        parts.append(f"xid {r.xid}")
    if r.kind == "ddl":
        parts.append("ddl statement at")
    if r.lsn is not None:
        parts.append(f"lsn {r.lsn}")
    if r.table is not None:
        parts.append(r.table)
    elif r.kind == "error":
        parts.append("any table")
    if r.op is not None:
        parts.append(",".join(r.op))
    if r.sqlstate is not None:
        parts.append("sqlstate " + ",".join(r.sqlstate))
    return " ".join(parts)


def _state(r: Rule) -> str:
    if not r.done:
        return "active"
    end = f" (end {r.done_end_lsn})" if r.done_end_lsn else ""
    return f"done {_minute(r.done_at)}{end}"


def _minute(t: dt.datetime | None) -> str:
    return "-" if t is None else t.astimezone().strftime("%Y-%m-%d %H:%M:%S")


# --- kept changes ------------------------------------------------------------


@dataclass
class KeptChange:
    """One row of ``applier.skipped_changes``."""

    id: int
    recorded_at: dt.datetime
    origin: str
    rule_id: int | None
    xid: int | None
    commit_lsn: str | None
    end_lsn: str | None
    change_lsn: str | None
    change_no: int
    commit_time: dt.datetime | None
    schema_name: str | None
    table_name: str | None
    op: str
    skipped: bool
    key: dict[str, str | None] | None
    old_row: dict[str, str | None] | None
    new_row: dict[str, str | None] | None
    error: str | None
    sqlstate: str | None
    #: The skipped DDL statement (op ``ddl``; migration 0012).
    statement: str | None = None

    @property
    def txn(self) -> tuple[int | None, str | None]:
        """What identifies its source transaction."""
        return self.xid, self.commit_lsn

    def as_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("recorded_at", "commit_time"):
            d[k] = d[k].isoformat() if d[k] is not None else None
        return d


_KEPT = """
SELECT id, recorded_at, origin, rule_id, xid, commit_lsn::text AS commit_lsn,
       end_lsn::text AS end_lsn, change_lsn::text AS change_lsn, change_no, commit_time,
       schema_name, table_name, op, skipped, key, old_row, new_row, error, sqlstate,
       statement
  FROM applier.skipped_changes
 WHERE origin = %(origin)s
   AND (%(xid)s::bigint IS NULL OR xid = %(xid)s::bigint)
   AND (%(lsn)s::pg_lsn IS NULL OR commit_lsn = %(lsn)s::pg_lsn)
 ORDER BY commit_lsn NULLS LAST, xid, change_no, id
"""


def kept_changes(
    conn: psycopg.Connection[Any], origin: str, *, xid: int | None = None, lsn: Lsn | None = None
) -> list[KeptChange]:
    """The kept changes of ``origin`` (one transaction's, with ``xid`` or ``lsn``), in
    the order they were committed on the source."""
    if not has_tables(conn):
        return []
    params = {"origin": origin, "xid": xid, "lsn": str(lsn) if lsn is not None else None}
    rows = conn.cursor(row_factory=dict_row).execute(_KEPT, params).fetchall()
    return [KeptChange(**r) for r in rows]


def rule_exists_for(conn: psycopg.Connection[Any], origin: str, lsn: Lsn) -> int | None:
    """The id of a transaction rule of ``origin`` for finish LSN ``lsn``, if any."""
    if not has_tables(conn):
        return None
    row = conn.execute(
        "SELECT id FROM applier.skip_rules WHERE origin = %s AND kind = 'txn' "
        "AND lsn = %s::pg_lsn ORDER BY done, id LIMIT 1",
        (origin, str(lsn)),
    ).fetchone()
    return int(row[0]) if row else None
