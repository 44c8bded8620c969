"""What a target table's write-set keys are made of: its unique indexes and foreign keys.

Read once per target table (two catalog queries, on the leader's catalog
connection, never per change) and handed to :class:`~.writeset.TableKeys`,
which turns column names into the source columns of a mapping.

* **Unique indexes** (and unique or primary key constraints): the key columns
  in index order (INCLUDE columns left out: they do not take part in
  uniqueness), whether NULLs are distinct (``NULLS NOT DISTINCT``, 15+, makes
  two NULLs collide), and whether the index can be keyed at all: an exclusion
  constraint (conflicts are not equality), a partial or an expression index
  (which rows collide depends on more than the columns' values) cannot.
* **Foreign keys out of the table** (it is the child): the child's columns and
  the parent's referenced columns, pair by pair; whether the column types are
  the same on both sides (a key is a hash of the bytes the source sent, and
  ``int4`` and ``int8`` spell equal values alike as text but not in binary);
  and whether the constraint's RI triggers fire for an apply session
  (``tgenabled`` A or R: they were made ENABLE ALWAYS; by default they are
  ORIGIN triggers and ``session_replication_role = replica`` skips them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg


@dataclass(frozen=True, slots=True)
class UniqueIndex:
    #: Key columns, in index order.
    columns: tuple[str, ...]
    #: Rows collide only when equal in every column (not an exclusion constraint,
    #: no predicate, no expression).
    keyable: bool
    #: ``NULLS NOT DISTINCT``: rows with NULL in the same columns collide too.
    nulls_collide: bool = False


@dataclass(frozen=True, slots=True)
class ForeignKey:
    #: The referenced (parent) table's oid on the target.
    parent: int
    #: (child column, parent column) pairs, in the constraint's order.
    pairs: tuple[tuple[str, str], ...]
    #: Every child column has its parent column's type (equal values, equal bytes).
    same_types: bool
    #: Its RI triggers fire under ``session_replication_role = replica``.
    fires: bool = False


@dataclass(frozen=True, slots=True)
class TargetKeys:
    """A target table's unique indexes and outgoing foreign keys."""

    oid: int
    unique: tuple[UniqueIndex, ...] = ()
    foreign: tuple[ForeignKey, ...] = ()


# to_jsonb: indnullsnotdistinct exists from PostgreSQL 15 on; a 14 target has none.
_UNIQUE = """
SELECT NOT i.indisexclusion AND i.indexprs IS NULL AND i.indpred IS NULL,
       coalesce((pg_catalog.to_jsonb(i) ->> 'indnullsnotdistinct')::boolean, false),
       ARRAY(SELECT a.attname::text
               FROM pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY k(attnum, n)
               JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
              WHERE k.n <= i.indnkeyatts
              ORDER BY k.n)
  FROM pg_catalog.pg_index i
 WHERE i.indrelid = %(oid)s AND (i.indisunique OR i.indisexclusion)
 ORDER BY i.indexrelid
"""

_FOREIGN = """
SELECT c.confrelid::pg_catalog.int8,
       ARRAY(SELECT a.attname::text FROM pg_catalog.unnest(c.conkey) WITH ORDINALITY k(attnum, n)
               JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
              ORDER BY k.n),
       ARRAY(SELECT a.attname::text FROM pg_catalog.unnest(c.confkey) WITH ORDINALITY k(attnum, n)
               JOIN pg_catalog.pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum
              ORDER BY k.n),
       ARRAY(SELECT a.atttypid FROM pg_catalog.unnest(c.conkey) WITH ORDINALITY k(attnum, n)
               JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
              ORDER BY k.n)
     = ARRAY(SELECT a.atttypid FROM pg_catalog.unnest(c.confkey) WITH ORDINALITY k(attnum, n)
               JOIN pg_catalog.pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum
              ORDER BY k.n),
       EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                WHERE t.tgconstraint = c.oid AND t.tgrelid = c.conrelid
                  AND t.tgenabled IN ('A', 'R'))
  FROM pg_catalog.pg_constraint c
 WHERE c.contype = 'f' AND c.conrelid = %(oid)s
 ORDER BY c.oid
"""


def load(conn: psycopg.Connection[Any], oid: int) -> TargetKeys:
    """The unique indexes and outgoing foreign keys of target table ``oid``."""
    unique = tuple(
        UniqueIndex(tuple(str(c) for c in cols), bool(keyable), bool(nnd))
        for keyable, nnd, cols in conn.execute(_UNIQUE, {"oid": oid}).fetchall()
    )
    foreign = tuple(
        ForeignKey(int(parent), tuple(zip(child, ref, strict=True)), bool(same), bool(fires))
        for parent, child, ref, same, fires in conn.execute(_FOREIGN, {"oid": oid}).fetchall()
    )
    return TargetKeys(oid, unique, foreign)
