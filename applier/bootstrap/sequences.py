"""Sequence values: pgoutput does not replicate them, so they are copied.

The sequences of a table are those it owns (serial, identity) and those its
column defaults call. ``bootstrap`` reads them in the driver's snapshot
transaction and keeps the values in the bookkeeping until the hand-off (a
sequence's tuple is not MVCC, so the value read is the current one, never
below the snapshot's: safe, as sequences only need to be ahead).
``applier sync-sequences`` copies the current source values at cutover,
when writes have stopped on the source.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from .. import pgconn
from ..errors import BootstrapError, SourceError
from ..privileges import check, scope_of
from ..redact import redact_dsn
from .plan import discover, published_tables, quote_qual

if TYPE_CHECKING:  # imported by tasks on executors, without the config library
    from ..config import Config

log = logging.getLogger(__name__)
Conn = psycopg.Connection[Any]

_SEQS = """
SELECT s.nspname, s.relname FROM (
  SELECT d.objid AS seq FROM pg_depend d
  WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
    AND d.refobjid = ANY(%(t)s::regclass[]) AND d.deptype IN ('a', 'i')
  UNION
  SELECT d.refobjid FROM pg_attrdef ad
  JOIN pg_depend d ON d.classid = 'pg_attrdef'::regclass AND d.objid = ad.oid
    AND d.refclassid = 'pg_class'::regclass
  WHERE ad.adrelid = ANY(%(t)s::regclass[])
) x JOIN (SELECT c.oid, n.nspname, c.relname, c.relkind FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace) s ON s.oid = x.seq
WHERE s.relkind = 'S' ORDER BY 1, 2
"""

SeqValue = tuple[str, str, int, bool]


def sequences_of(src: Conn, tables: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    regs = [quote_qual(s, n) for s, n in tables]
    return [(r[0], r[1]) for r in src.execute(_SEQS, {"t": regs}).fetchall()] if regs else []


def read_values(src: Conn, seqs: Iterable[tuple[str, str]]) -> list[SeqValue]:
    out = []
    for schema, name in seqs:
        row = src.execute(
            sql.SQL("SELECT last_value, is_called FROM {}").format(sql.Identifier(schema, name))
        ).fetchone()
        assert row is not None
        out.append((schema, name, int(row[0]), bool(row[1])))
    return out


def set_values(tgt: Conn, values: Iterable[SeqValue]) -> int:
    """setval() each sequence on the target; raise naming the ones it lacks."""
    missing, done = [], 0
    for schema, name, last, called in values:
        qual = quote_qual(schema, name)
        if tgt.execute("SELECT to_regclass(%s)", (qual,)).fetchone() == (None,):
            missing.append(f"{schema}.{name}")
            continue
        tgt.execute("SELECT setval(%s::regclass, %s, %s)", (qual, last, called))
        done += 1
    if missing:
        raise BootstrapError(
            f"sequence(s) {', '.join(missing)} missing on the target",
            hint="create them on the target (or rerun applier bootstrap) and rerun",
        )
    return done


def sync_sequences(cfg: Config) -> int:
    """``applier sync-sequences``: current source values onto the target."""
    src_dsn, tgt_dsn = cfg.source.conninfo(), cfg.target.conninfo()
    with connect(src_dsn, "source") as src, connect(tgt_dsn, "target") as tgt:
        # Before discovery, which needs USAGE on the schemas: one refusal for all.
        scope = scope_of(src, published_tables(src, cfg))
        check("sync-sequences", scope, source=src, target=tgt)
        tables = discover(src, cfg).ddl_tables
        values = read_values(src, sequences_of(src, tables))
        n = set_values(tgt, values)
    log.info("sequences synchronised", extra={"ctx": {"sequences": n}})
    print(f"{n} sequence(s) set on the target from the source's current values")
    return 0


def connect(conninfo: str, side: pgconn.Side) -> Conn:
    """An autocommit connection, pinned (:mod:`applier.pgconn`); an unreachable server
    is a one-line error."""
    try:
        return pgconn.connect(conninfo, side=side, purpose="applier-bootstrap")
    except psycopg.OperationalError as e:
        first = str(e).strip().splitlines()[-1] if str(e).strip() else "connection failed"
        kind = SourceError if side == "source" else BootstrapError
        raise kind(
            f"cannot connect to the {side} ({redact_dsn(conninfo)}): {first}",
            hint=f"check [{side}] dsn and that the server is up",
        ) from None
