"""Which tables to copy, and the slices each is cut into.

The tables are those of the configured publications (``pg_publication_tables``)
that ``[tables]`` include/exclude lets through. A partitioned table (or a leaf
published on its own) is expanded to its whole partition tree: every member is
created on the target (pg_dump needs the parents for ATTACH PARTITION), and
every leaf is copied as its own table. Publication column lists and row
filters (PG15+) are honoured, as the built-in table sync does.

Slicing is by physical block range, ``ctid >= '(a,0)' AND ctid < '(b,0)'``:
PG14+ answers that with a TID range scan that reads only those blocks, so N
slices read the heap once in total, with no index and no sort (pgcopydb's
"same-table concurrency" does the same). The block count comes from
``pg_relation_size`` when the plan is made, which is after the snapshot was
taken, so every tuple the snapshot sees lies in a block that existed then;
the first slice still has no lower bound and the last no upper bound, so a
slice plan can never miss a block whatever the estimate says.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from .. import refusal
from ..errors import BootstrapError

if TYPE_CHECKING:  # imported by tasks on executors, without the config library
    from ..config import Config

Conn = psycopg.Connection[Any]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Column:
    name: str
    type_name: str  # format_type(), e.g. "numeric(10,2)"


@dataclass
class TableSpec:
    """One source heap to copy (a plain table or a leaf partition)."""

    schema: str
    name: str
    root: tuple[str, str]  # top of its partition tree (itself when not a partition)
    columns: list[Column]
    blocks: int
    heap_bytes: int
    est_rows: int
    row_filter: str | None = None
    #: Its OID on the source (a table renamed later is known by it: apply.tablesync).
    relid: int | None = None
    # Filled in once the target side is known (see job.resolve_targets).
    dst: tuple[str, str] | None = None
    binary: bool = True
    slices: list[Slice] = field(default_factory=list)

    @property
    def qualname(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True)
class Slice:
    """Blocks [lo, hi) of one table; ``None`` means unbounded on that side."""

    slice_no: int
    lo: int | None
    hi: int | None

    def where(self, row_filter: str | None = None) -> str | None:
        """The WHERE condition text (only integers and the catalog's row filter go in)."""
        parts = []
        if self.lo is not None:
            parts.append(f"ctid >= '({self.lo},0)'::tid")
        if self.hi is not None:
            parts.append(f"ctid < '({self.hi},0)'::tid")
        if row_filter:
            parts.append(f"({row_filter})")
        return " AND ".join(parts) or None


@dataclass
class SourcePlan:
    """What discovery found: tables to create (whole trees) and heaps to copy."""

    ddl_tables: list[tuple[str, str]]
    tables: list[TableSpec]
    #: The source's server_version (0: not known), as discovery's connection read it.
    source_version: int = 0

    @property
    def source_major(self) -> int:
        """Its major version: the source's pg_dump and psql must be as new (bootstrap.clients)."""
        return self.source_version // 10000


def cut_slices(blocks: int, heap_bytes: int, slice_size: int, workers: int = 1) -> list[Slice]:
    """Cut ``blocks`` into about ``heap_bytes / slice_size`` contiguous, open-ended ranges.

    A table of more than one slice gets a multiple of ``workers`` slices (the
    Spark task slots), so its last wave keeps every slot busy instead of
    leaving one slice to run alone at the end.
    """
    n = max(1, math.ceil(heap_bytes / max(slice_size, 1)))
    if n > 1 and workers > 1:
        n = math.ceil(n / workers) * workers
    n = min(n, max(blocks, 1))
    if n == 1:
        return [Slice(0, None, None)]
    per = math.ceil(blocks / n)
    bounds = list(range(0, blocks, per))
    out = []
    for i, lo in enumerate(bounds):
        hi = bounds[i + 1] if i + 1 < len(bounds) else None
        out.append(Slice(i, lo if i else None, hi))
    return out


# -- discovery on the source ---------------------------------------------------


def check_publications(conn: Conn, pubs: Sequence[str]) -> None:
    rows = conn.execute("SELECT pubname FROM pg_catalog.pg_publication").fetchall()
    refusal.check_publications(pubs, [r[0] for r in rows])


def published_tables(conn: Conn, cfg: Config) -> dict[tuple[str, str], dict[str, Any]]:
    """Published tables passing the filters, with their column list and row filter."""
    check_publications(conn, cfg.source.publications)
    has_filters = conn.info.server_version >= 150000
    cols = ", attnames, rowfilter" if has_filters else ", NULL::name[], NULL::text"
    rows = conn.execute(
        sql.SQL(
            "SELECT pt.schemaname, pt.tablename{}, p.pubupdate OR p.pubdelete "
            "FROM pg_publication_tables pt JOIN pg_publication p USING (pubname) "
            "WHERE pubname = ANY(%s) ORDER BY 1, 2"
        ).format(sql.SQL(cols)),
        (list(cfg.source.publications),),
    ).fetchall()
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for schema, name, attnames, rowfilter, upd in rows:
        if not cfg.tables.includes(schema, name):
            continue
        cur = out.setdefault(
            (schema, name),
            {"cols": set(), "all_cols": False, "filters": [], "unfiltered": False, "upd": False},
        )
        if attnames is None:
            cur["all_cols"] = True
        else:
            cur["cols"].update(attnames)
        if rowfilter is None:
            cur["unfiltered"] = True
        else:
            cur["filters"].append(rowfilter)
        cur["upd"] = cur["upd"] or upd
    if not out:
        raise BootstrapError(
            f"no table of publication(s) {', '.join(cfg.source.publications)} passes "
            "[tables] include/exclude",
            hint="add tables to the publication or widen tables.include",
        )
    return out


_TREE = """
SELECT n.nspname, c.relname, c.relkind, t.level, c.relreplident,
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
       pg_relation_size(c.oid), c.reltuples::bigint, c.oid
FROM (SELECT relid, level FROM pg_partition_tree(%(oid)s::regclass)
      UNION ALL  -- a table outside any partition tree has no rows there
      SELECT %(oid)s::regclass, 0
      WHERE NOT EXISTS (SELECT 1 FROM pg_partition_tree(%(oid)s::regclass))) t
JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
UNION ALL
SELECT n.nspname, c.relname, c.relkind, -a.n, c.relreplident, true, 0, 0, c.oid
FROM unnest((SELECT array_agg(x) FROM pg_partition_ancestors(%(oid)s::regclass) x))
     WITH ORDINALITY a(relid, n)
JOIN pg_class c ON c.oid = a.relid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE a.relid <> %(oid)s::regclass
ORDER BY 4
"""


#: _TREE for sources before 12 (no pg_partition_tree/pg_partition_ancestors): the
#: same rows from pg_inherits, following partitions only as those functions do.
_TREE_PRE12 = """
WITH RECURSIVE down(relid, level) AS (
  SELECT %(oid)s::regclass::oid, 0
  UNION ALL
  SELECT i.inhrelid, d.level + 1 FROM pg_inherits i
  JOIN down d ON i.inhparent = d.relid
  JOIN pg_class ch ON ch.oid = i.inhrelid AND ch.relispartition
), up(relid, n) AS (  -- from 2: pg_partition_ancestors lists the table itself first
  SELECT i.inhparent, 2 FROM pg_inherits i
  JOIN pg_class ch ON ch.oid = i.inhrelid AND ch.relispartition
  WHERE i.inhrelid = %(oid)s::regclass
  UNION ALL
  SELECT i.inhparent, u.n + 1 FROM pg_inherits i
  JOIN up u ON i.inhrelid = u.relid
  JOIN pg_class ch ON ch.oid = i.inhrelid AND ch.relispartition
)
SELECT n.nspname, c.relname, c.relkind, d.level, c.relreplident,
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
       pg_relation_size(c.oid), c.reltuples::bigint, c.oid
FROM down d JOIN pg_class c ON c.oid = d.relid JOIN pg_namespace n ON n.oid = c.relnamespace
UNION ALL
SELECT n.nspname, c.relname, c.relkind, -u.n, c.relreplident, true, 0, 0, c.oid
FROM up u JOIN pg_class c ON c.oid = u.relid JOIN pg_namespace n ON n.oid = c.relnamespace
ORDER BY 4
"""


def tree_sql(server_version: int) -> str:
    """The partition tree query for the source's version."""
    return _TREE if server_version >= 120000 else _TREE_PRE12


def quote_qual(schema: str, name: str) -> str:
    ident = sql.Identifier(schema, name)
    return ident.as_string(None)


def discover(conn: Conn, cfg: Config) -> SourcePlan:
    """The tables to create and copy; a warning for each without a replica identity
    (once per table and process: a command reads the plan more than once)."""
    pub = published_tables(conn, cfg)
    block_size = int(conn.execute("SHOW block_size").fetchone()[0])  # type: ignore[index]
    ddl: dict[tuple[str, str], None] = {}
    specs: dict[tuple[str, str], TableSpec] = {}
    for (schema, name), info in pub.items():
        tree = tree_sql(conn.info.server_version)
        rows = conn.execute(tree, {"oid": quote_qual(schema, name)}).fetchall()
        root = min(rows, key=lambda r: r[3])
        for nsp, rel, kind, _lvl, ident, has_pk, size, tuples, relid in rows:
            ddl[(nsp, rel)] = None
            if kind != "r" or (nsp, rel) in specs:
                continue
            if info["upd"] and (ident == "n" or (ident == "d" and not has_pk)):
                _warn_no_identity(conn.info.dbname, nsp, rel)
            specs[(nsp, rel)] = TableSpec(
                schema=nsp,
                name=rel,
                root=(root[0], root[1]),
                columns=_columns(conn, nsp, rel, None if info["all_cols"] else info["cols"]),
                blocks=math.ceil(size / block_size),
                heap_bytes=int(size),
                est_rows=max(int(tuples), 0),
                row_filter=_combine_filters(info),
                relid=int(relid),
            )
    return SourcePlan(
        ddl_tables=list(ddl),
        tables=list(specs.values()),
        source_version=conn.info.server_version,
    )


#: Tables already warned about in this process, by source database: one command
#: reads the plan several times (bootstrap for the copy and the sequences;
#: verify, and cutover --verify, three times), and one warning per table is
#: enough. The database is part of the key: a process that serves several
#: (the tests, a script calling applier's functions) warns for each.
_warned_no_identity: set[tuple[str, str, str]] = set()


def _warn_no_identity(dbname: str, nsp: str, rel: str) -> None:
    # As the built-in subscriber: an insert-only table (a log) needs no
    # identity; the source itself refuses its UPDATEs and DELETEs.
    if (dbname, nsp, rel) in _warned_no_identity:
        return
    _warned_no_identity.add((dbname, nsp, rel))
    log.warning(
        "table %s.%s has no replica identity: it is copied and its INSERTs replicated, "
        "but UPDATE and DELETE on it will fail on the source while it is published for them "
        "(add a primary key or run ALTER TABLE %s REPLICA IDENTITY FULL if they are needed)",
        nsp, rel, quote_qual(nsp, rel),
    )  # fmt: skip


def _combine_filters(info: dict[str, Any]) -> str | None:
    # A row is published when any publication publishes it: OR of the filters,
    # and no filter at all as soon as one publication has none.
    if info["unfiltered"] or not info["filters"]:
        return None
    return " OR ".join(f"({f})" for f in info["filters"])


def _columns(conn: Conn, schema: str, name: str, only: Iterable[str] | None) -> list[Column]:
    # Generated columns (PostgreSQL 12+) are computed on the target; COPY cannot write them.
    generated = " AND attgenerated = ''" if conn.info.server_version >= 120000 else ""
    rows = conn.execute(
        sql.SQL(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped{} ORDER BY attnum"
        ).format(sql.SQL(generated)),
        (quote_qual(schema, name),),
    ).fetchall()
    keep = set(only) if only is not None else None
    return [Column(r[0], r[1]) for r in rows if keep is None or r[0] in keep]


def target_columns(conn: Conn, schema: str, name: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
        "AND attgenerated = ''",
        (quote_qual(schema, name),),
    ).fetchall()
    return {r[0]: r[1] for r in rows}
