"""The bootstrap's checks of the target and the slot, and the truncation they allow.

Every refusal of a bootstrap is made here (:class:`~applier.errors.BootstrapRefused`,
exit 3: a restart finds the same tables and slot) (and in :func:`.schema.missing_types`)
before anything is changed: :func:`check_target` and :func:`check_slot` only
read; :func:`truncate_tables` empties what :func:`check_target` allowed.

A plain table's rows are its own: row checks and TRUNCATE name it with
``ONLY``, so an inheritance child (a table of its own, copied only if it is
published itself) is neither counted nor emptied through its parent. A
partitioned table is checked and emptied as a whole (its rows are its
partitions').
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import sql

from ..errors import BootstrapRefused
from . import schema as ddl
from .plan import SourcePlan, TableSpec, quote_qual, target_columns

log = logging.getLogger(__name__)
Conn = psycopg.Connection[Any]
Relation = tuple[str, str]


def check_target(
    tgt: Conn, plan: SourcePlan, *, ours: list[Relation], truncate: bool
) -> list[tuple[Relation, str]]:
    """Refuse non-empty tables (unless ours or --truncate) and existing tables lacking
    a copied column; change nothing. Returns the tables to empty, with their relkind.

    A plain table's rows are its own (``ONLY``): an inheritance child is a
    table of its own, copied (and emptied) only if it is published itself.
    """
    present = set(plan.ddl_tables) - set(ddl.missing_tables(tgt, plan.ddl_tables))
    kinds = {t: _kind(tgt, t) for t in present}
    full = [t for t in present if kinds[t] in ("r", "p") and _has_rows(tgt, t, kinds[t])]
    mine = set(ours)
    refused = [t for t in full if t not in mine]
    if refused and not truncate:
        names = ", ".join(f"{s}.{n}" for s, n in sorted(refused))
        raise BootstrapRefused(
            f"target table(s) {names} are not empty",
            hint="empty them, or pass --truncate to have bootstrap empty them",
        )
    for t in plan.tables:
        if (t.schema, t.name) in present:
            _check_columns(tgt, t)
    return [(t, kinds[t]) for t in full if t in mine or truncate]


def _check_columns(tgt: Conn, t: TableSpec) -> None:
    dst_cols = target_columns(tgt, t.schema, t.name)
    lacking = [c.name for c in t.columns if c.name not in dst_cols]
    if lacking:
        raise BootstrapRefused(
            f"target table {t.schema}.{t.name} lacks column(s) {', '.join(lacking)}",
            hint="add the columns on the target (same types as on the source) and rerun",
        )


def check_slot(src: Conn, slot: str, may_drop: bool) -> None:
    """Refuse a slot that exists unless --recreate-slot or our unfinished run made it."""
    row = src.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    if row.fetchone() is not None and not may_drop:
        raise BootstrapRefused(
            f"replication slot {slot} exists already on the source",
            hint="use --recreate-slot to drop it and bootstrap anew "
            "(any consumer of that slot loses its position)",
        )


def _kind(tgt: Conn, t: Relation) -> str:
    row = tgt.execute("SELECT relkind FROM pg_class WHERE oid = %s::regclass", (quote_qual(*t),))
    return str(row.fetchone()[0])  # type: ignore[index]


def _only(t: Relation, kind: str) -> sql.Composable:
    # A partitioned table's rows are its partitions' (TRUNCATE ONLY refuses it).
    ident = sql.Identifier(*t)
    return ident if kind == "p" else sql.SQL("ONLY {}").format(ident)


def _has_rows(tgt: Conn, t: Relation, kind: str) -> bool:
    q = sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(_only(t, kind))
    return bool(tgt.execute(q).fetchone()[0])  # type: ignore[index]


def truncate_tables(tgt: Conn, tables: list[tuple[Relation, str]]) -> None:
    if not tables:
        return
    names = sql.SQL(", ").join(_only(t, kind) for t, kind in sorted(tables))
    tgt.execute(sql.SQL("TRUNCATE {}").format(names))
    log.info("target tables truncated", extra={"ctx": {"tables": len(tables)}})
