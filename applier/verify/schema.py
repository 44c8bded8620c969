"""The schema half of ``applier verify``: what the target's definitions lack or change.

Per included table (partition parents too): the table itself, its columns
(``format_type`` and NOT NULL, by name: column order may differ), its
primary key (columns in order), its indexes and its constraints.

Indexes and constraints are compared *by definition*, not by name:
``pg_get_indexdef`` with the index's own name taken out (``CREATE UNIQUE
INDEX <name> ON ...``), ``pg_get_constraintdef`` with the constraint type.
A target index made by hand under another name is the same index; the
names do not matter to queries or to the apply. A definition on one side
only is a difference; two definitions that differ show as one missing and
one extra. NOT NULL constraints (catalogued as constraints since PostgreSQL
18) are compared with the columns instead.

Sequences (owned by or used in defaults of the tables, as the bootstrap
copies them): a target whose next value is at or past the source's is fine
(``sync-sequences`` may have run ahead), behind is a difference: the next
insert on the target would reuse a value.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import psycopg

from ..bootstrap.plan import quote_qual
from ..bootstrap.sequences import sequences_of
from .report import SchemaDiff

Conn = psycopg.Connection[Any]

_COLUMNS = """
SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute
WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum
"""
_PKEY = """
SELECT array_agg(a.attname ORDER BY k.n) FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s::regclass AND i.indisprimary
"""
_INDEXES = """
SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid = %s::regclass
"""
_CONSTRAINTS = """
SELECT contype::text, pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = %s::regclass AND contype <> 'n'
"""
_INDEX_NAME = re.compile(r"^CREATE (UNIQUE )?INDEX \S+ ON ")
_CONTYPES = {"p": "primary key", "u": "unique", "c": "check", "f": "foreign key", "x": "exclude"}


def index_shape(definition: str) -> str:
    """An index definition without its name (``CREATE INDEX ON s.t USING btree (c)``)."""
    return _INDEX_NAME.sub(lambda m: f"CREATE {m.group(1) or ''}INDEX ON ", definition)


def _exists(conn: Conn, qual: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s)", (qual,)).fetchone()
    return row is not None and row[0] is not None


def compare_schema(src: Conn, tgt: Conn, tables: list[tuple[str, str]]) -> list[SchemaDiff]:
    out: list[SchemaDiff] = []
    present = []
    for schema, name in tables:
        qual, label = quote_qual(schema, name), f"{schema}.{name}"
        if not _exists(tgt, qual):
            out.append(SchemaDiff("table", label, label, "missing on the target"))
            continue
        present.append((schema, name))
        out += _columns(src, tgt, qual, label)
        out += _primary_key(src, tgt, qual, label)
        out += _by_definition(src, tgt, qual, label)
    out += compare_sequences(src, tgt, present)
    return out


def _columns(src: Conn, tgt: Conn, qual: str, label: str) -> list[SchemaDiff]:
    s = {r[0]: (r[1], r[2]) for r in src.execute(_COLUMNS, (qual,)).fetchall()}
    t = {r[0]: (r[1], r[2]) for r in tgt.execute(_COLUMNS, (qual,)).fetchall()}
    out = []
    for col in s.keys() | t.keys():
        a, b = s.get(col), t.get(col)
        if b is None:
            out.append(SchemaDiff("column", label, col, "missing on the target", a and a[0]))
        elif a is None:
            out.append(SchemaDiff("column", label, col, "only on the target", None, b[0]))
        elif a[0] != b[0]:
            out.append(SchemaDiff("column", label, col, "type differs", a[0], b[0]))
        elif a[1] != b[1]:
            what = "NOT NULL on the source only" if a[1] else "NOT NULL on the target only"
            out.append(SchemaDiff("column", label, col, what, a[1], b[1]))
    return sorted(out, key=lambda d: d.name)


def _primary_key(src: Conn, tgt: Conn, qual: str, label: str) -> list[SchemaDiff]:
    a = (src.execute(_PKEY, (qual,)).fetchone() or [None])[0]
    b = (tgt.execute(_PKEY, (qual,)).fetchone() or [None])[0]
    if a == b:
        return []
    problem = "missing on the target" if b is None else "differs"
    return [SchemaDiff("primary key", label, "", problem, a, b)]


def _by_definition(src: Conn, tgt: Conn, qual: str, label: str) -> list[SchemaDiff]:
    out = []
    idx_s = Counter(index_shape(r[0]) for r in src.execute(_INDEXES, (qual,)).fetchall())
    idx_t = Counter(index_shape(r[0]) for r in tgt.execute(_INDEXES, (qual,)).fetchall())
    for d in sorted((idx_s - idx_t).elements()):
        out.append(SchemaDiff("index", label, d, "missing on the target", d, None))
    for d in sorted((idx_t - idx_s).elements()):
        out.append(SchemaDiff("index", label, d, "only on the target", None, d))
    con_s = Counter((r[0], r[1]) for r in src.execute(_CONSTRAINTS, (qual,)).fetchall())
    con_t = Counter((r[0], r[1]) for r in tgt.execute(_CONSTRAINTS, (qual,)).fetchall())
    for kind, d in sorted((con_s - con_t).elements()):
        name = f"{_CONTYPES.get(kind, kind)} {d}"
        out.append(SchemaDiff("constraint", label, name, "missing on the target", d, None))
    for kind, d in sorted((con_t - con_s).elements()):
        name = f"{_CONTYPES.get(kind, kind)} {d}"
        out.append(SchemaDiff("constraint", label, name, "only on the target", None, d))
    return out


#: The problem of a sequence whose next value on the target is behind the source's.
SEQUENCE_BEHIND = "behind the source (next value)"

_SEQ = """
SELECT s.last_value, s.is_called, p.seqincrement FROM {} s, pg_sequence p
WHERE p.seqrelid = %s::regclass
"""


def _next_value(conn: Conn, qual: str) -> tuple[int, int]:
    row = conn.execute(_SEQ.format(qual), (qual,)).fetchone()  # qual: quote_qual output
    assert row is not None
    last, called, inc = int(row[0]), bool(row[1]), int(row[2])
    return (last + inc if called else last), inc


def compare_sequences(src: Conn, tgt: Conn, tables: list[tuple[str, str]]) -> list[SchemaDiff]:
    out = []
    for schema, name in sequences_of(src, tables):
        qual, label = quote_qual(schema, name), f"{schema}.{name}"
        if not _exists(tgt, qual):
            out.append(SchemaDiff("sequence", label, label, "missing on the target"))
            continue
        s_next, inc = _next_value(src, qual)
        t_next, _ = _next_value(tgt, qual)
        behind = t_next < s_next if inc > 0 else t_next > s_next
        if behind:
            out.append(SchemaDiff("sequence", label, label, SEQUENCE_BEHIND, s_next, t_next))
    return out
