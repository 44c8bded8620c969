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


__all__ = ["Origin", "SchemaStatement"]
