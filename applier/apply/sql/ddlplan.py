"""Schema statements for the target: what one schema change runs, and where it came from.

A schema change reaches the worker two ways (issue 33): a Relation message that
names what the target lacks (``[schema] follow``: a column added, a type
widened; planned by :mod:`applier.apply.handlers.follow`), or a statement
captured on the source and carried as a transactional logical message
(``source = 'ddl'``, :mod:`applier.ddl`). Both become :class:`SchemaStatement`
values and go through the one seam that runs them in the open target
transaction (:class:`~applier.apply.handlers.schema.SchemaChanges`), which
records each in ``applier.schema_changes`` (migration 0011). No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from psycopg import sql

#: Where a schema change came from (the CHECK of applier.schema_changes.source).
Origin = Literal["relation", "ddl"]


@dataclass(frozen=True, slots=True)
class SchemaStatement:
    """One statement to run on the target for a schema change of the source.

    ``statement`` is what the target runs: composed (identifiers quoted by
    psycopg.sql) or a string as captured. ``schema_name``/``table_name`` name the
    table it changes (None: no one table, or not known: every mapping is then
    rebuilt). ``search_path``: the path it runs under (a captured statement's
    unqualified names resolve as on the source); the session's pinned path is
    restored after it. ``hint``: what the user should do if it fails.
    """

    source: Origin
    command_tag: str
    schema_name: str | None
    table_name: str | None
    statement: sql.Composable | str
    source_statement: str | None = None
    search_path: str | None = None
    hint: str | None = None

    @property
    def qualname(self) -> str | None:
        """``schema.table`` when it changes one table (as errors name tables)."""
        if self.table_name is None:
            return None
        return f"{self.schema_name}.{self.table_name}" if self.schema_name else self.table_name


# Built-in type OIDs (the same on every server).
TEXT, VARCHAR, NUMERIC, VARBIT = 25, 1043, 1700, 1562
TIME, TIMETZ, TIMESTAMP, TIMESTAMPTZ, INTERVAL = 1083, 1266, 1114, 1184, 1186
#: Types whose typmod is a precision of fractional seconds (interval: in the low 16 bits).
_PRECISION = frozenset({TIME, TIMETZ, TIMESTAMP, TIMESTAMPTZ})
_INTERVAL_FULL = 0xFFFF


def widens(old_oid: int, old_mod: int, new_oid: int, new_mod: int) -> bool:
    """Whether a column of type (``old_oid``, ``old_mod``) may become (``new_oid``,
    ``new_mod``) in place: every old value is a new one unchanged, and PostgreSQL
    changes it without rewriting the table (the type is binary coercible, or the
    length coercion's support function says the new modifier takes every value:
    varchar, numeric, varbit, time, timestamp, interval). -1 is no modifier."""
    if old_oid == new_oid:
        if old_mod == new_mod:
            return False
        if new_mod == -1:
            return old_oid in (VARCHAR, VARBIT, NUMERIC, INTERVAL) or old_oid in _PRECISION
        if old_mod == -1:
            return False
        if old_oid in (VARCHAR, VARBIT) or old_oid in _PRECISION:
            return new_mod > old_mod
        if old_oid == NUMERIC:  # ((precision << 16) | scale) + 4
            (op, os), (np, ns) = divmod(old_mod - 4, 65536), divmod(new_mod - 4, 65536)
            return ns == os and np > op
        if old_oid == INTERVAL:  # (fields << 16) | precision
            (of, op), (nf, np) = divmod(old_mod, 65536), divmod(new_mod, 65536)
            return of == nf and (np > op or np == _INTERVAL_FULL)
        return False
    return old_oid == VARCHAR and new_oid == TEXT


__all__ = ["Origin", "SchemaStatement", "widens"]
