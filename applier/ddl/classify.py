"""What the worker does with one captured statement: refuse it, ignore it, or run what.

Pure (no I/O): :func:`classify` reads a :class:`~applier.ddl.message.DdlMessage`
and the config and returns a :class:`Verdict`, which the worker's DDL part
(:mod:`applier.apply.handlers.ddl`) acts on at the message's position.

Ignored (counted, never a stop)
    A statement on temporary objects only (``pg_temp*`` schemas; the capture
    leaves them out, so such a message normally has no object at all), or one
    whose objects are none of the worker's: no table ``[tables]`` includes, and
    no schema object in a schema where ``[tables]`` may include a table.
    Source-side objects (publications, subscriptions, event triggers) are
    never replayed: a table added to our publication is reported in
    :attr:`Verdict.published` for the worker to fill (sync-tables).

Refused (the worker stops with the skip command; each reason is one line)
    * a string of several statements (``current_query()`` is the client's
      whole string: what the target would run is not this one command);
    * ``CREATE TABLE AS`` / ``SELECT INTO`` (the rows come from the source's
      query; replayed, the target's query would make other rows);
    * a statement touching tables ``[tables]`` includes and tables it
      excludes at once (the target has only half of what it names);
    * a statement a function or DO block ran (the text is the client's call,
      whose command is not the tag's), unless ``[ddl] allow_from_functions``.

Run
    The statement as written, but a ``CONCURRENTLY`` form (CREATE INDEX,
    DROP INDEX, REINDEX, DETACH PARTITION) loses the word: the target runs it
    inside the transaction that applies the changes around it, where
    ``CONCURRENTLY`` is refused; the result is the same index.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from applier.config import Config
from applier.ddl.message import DdlMessage, DdlObject
from applier.ddl.sqltext import Token, Unterminated, identity_parts, statements, unquote, words

#: Kinds of object that belong to one table, named "<name> on <table>" by PostgreSQL.
_ON_TABLE = frozenset({"table constraint", "trigger", "rule", "policy"})
#: Kinds that are a table (or hold its rows' shape).
_TABLES = frozenset({"table", "foreign table", "partitioned table"})
#: Objects of the source's replication set-up, never replayed.
_SOURCE_SIDE = ("PUBLICATION", "SUBSCRIPTION", "EVENT TRIGGER")
#: Words between CREATE and the object's kind that the command tag leaves out.
_NOISE = frozenset(
    {"OR", "REPLACE", "UNIQUE", "TEMP", "TEMPORARY", "UNLOGGED", "GLOBAL", "LOCAL",
     "CONSTRAINT", "DEFAULT", "TRUSTED", "PROCEDURAL", "RECURSIVE", "CONCURRENTLY"}
)  # fmt: skip
#: Commands whose CONCURRENTLY form a transaction refuses.
_CONCURRENT = frozenset({"CREATE INDEX", "DROP INDEX", "REINDEX", "ALTER TABLE"})


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one captured statement."""

    #: Why it must not run (the worker stops), or None.
    refusal: str | None = None
    #: Why the worker has nothing to do with it (ignored, counted), or None.
    ignored: str | None = None
    #: What the target runs (``CONCURRENTLY`` taken out).
    statement: str = ""
    #: The (schema, table) the statement is mainly about, for the records.
    table: tuple[str, str] | None = None
    #: Included tables an ``ALTER PUBLICATION ... ADD/SET TABLE`` added to our publication.
    published: tuple[tuple[str, str], ...] = field(default=())
    #: The text is a function's or DO block's caller (``allow_from_functions``): one
    #: call sends a message per statement it ran, each with this text.
    from_function: bool = False

    @property
    def runs(self) -> bool:
        return self.refusal is None and self.ignored is None


def classify(m: DdlMessage, cfg: Config) -> Verdict:
    """Decide about ``m`` (see the module docstring, in its order)."""
    try:
        stmts = statements(m.statement)
    except Unterminated as e:
        return Verdict(refusal=f"the statement cannot be read: {e}")
    objects = [o for o in m.objects if not _temporary(o)]
    if not stmts or (m.objects and not objects):
        return Verdict(ignored="temporary objects only")
    tag = m.tag.upper()
    if any(tag.startswith(k) or tag.endswith(k) for k in _SOURCE_SIDE):
        return _source_side(m, stmts, cfg)
    tables = _tables(objects, stmts[0], tag)
    included = [t for t in tables if cfg.tables.includes(*t)]
    excluded = [t for t in tables if not cfg.tables.includes(*t)]
    # Tables decide when it names some; else its schema objects do (a type, a schema).
    ours = bool(included) if tables else any(_in_our_schemas(o, cfg) for o in objects)
    if not ours and (objects or m.via == "trigger"):
        # `ddl run` of a statement that made no object the capture saw: run as asked.
        return Verdict(ignored="none of its objects is replicated")
    main = included[0] if included else None
    if len(stmts) > 1:
        return Verdict(refusal=f"{len(stmts)} statements in one string", table=main)
    if tag in ("CREATE TABLE AS", "SELECT INTO"):
        return Verdict(refusal=f"{tag}: its rows come from a query on the source", table=main)
    if included and excluded:
        return Verdict(
            refusal="it touches replicated tables ("
            + ", ".join(_show(t) for t in included)
            + ") and tables [tables] excludes ("
            + ", ".join(_show(t) for t in excluded)
            + ")",
            table=main,
        )
    from_function = not matches_tag(stmts[0], tag)
    if from_function and not cfg.ddl.allow_from_functions:
        return Verdict(
            refusal=f"a function or DO block ran {tag} (the statement is the caller's)",
            table=main,
        )
    return Verdict(
        statement=without_concurrently(m.statement, stmts[0], tag),
        table=main,
        from_function=from_function,
    )


def _temporary(o: DdlObject) -> bool:
    return o.schema is not None and (o.schema.startswith("pg_temp") or o.schema == "pg_temp")


def _table_of(o: DdlObject) -> tuple[str, str] | None:
    """The (schema, table) an object is or belongs to, when its identity says so."""
    kind = o.kind.lower()
    try:
        if kind in _TABLES or kind == "table column":
            parts = identity_parts(o.identity)
            return (parts[0], parts[1]) if len(parts) >= 2 else None
        if kind in _ON_TABLE and " on " in o.identity:
            parts = identity_parts(o.identity.rsplit(" on ", 1)[1])
            return (parts[0], parts[1]) if len(parts) == 2 else None
    except Unterminated:
        return None
    return None


def _tables(objects: list[DdlObject], stmt: list[Token], tag: str) -> list[tuple[str, str]]:
    found = [t for t in map(_table_of, objects) if t is not None]
    if tag == "CREATE INDEX":
        on = _index_table(stmt, objects)
        if on is not None:
            found.append(on)
    return list(dict.fromkeys(found))


def _index_table(stmt: list[Token], objects: list[DdlObject]) -> tuple[str, str] | None:
    """CREATE INDEX ... ON [ONLY] table: the table (its schema the index's when unqualified)."""
    for i, t in enumerate(stmt):
        if t.upper == "ON":
            rest = stmt[i + 1 :]
            if rest and rest[0].upper == "ONLY":
                rest = rest[1:]
            if len(rest) >= 3 and rest[1].text == ".":
                return unquote(rest[0]), unquote(rest[2])
            schema = next((o.schema for o in objects if o.schema), None)
            return (schema, unquote(rest[0])) if rest and schema else None
    return None


def _in_our_schemas(o: DdlObject, cfg: Config) -> bool:
    """A schema object (type, sequence, function, index, the schema itself) where
    ``[tables]`` may include a table."""
    schema = o.schema
    if o.kind.lower() == "schema":
        try:
            schema = identity_parts(o.identity)[0]
        except (Unterminated, IndexError):
            return False
    if schema is None:
        return False
    return any(fnmatch.fnmatchcase(schema, p.partition(".")[0]) for p in cfg.tables.include)


def matches_tag(stmt: list[Token], tag: str) -> bool:
    """Whether the statement's own command is ``tag`` (not a function's DDL)."""
    said = words(stmt)
    want = tag.split()
    if not said or not want or said[0] != want[0]:
        return False
    rest = [w for w in said[1:] if w not in _NOISE]
    return rest[: len(want) - 1] == want[1:]


def without_concurrently(text: str, stmt: list[Token], tag: str) -> str:
    """``text`` without its CONCURRENTLY (see the module docstring)."""
    if tag not in _CONCURRENT:
        return text
    cuts: list[tuple[int, int]] = []
    for i, t in enumerate(stmt):
        if t.upper != "CONCURRENTLY":
            continue
        if tag == "REINDEX" and i > 0 and stmt[i - 1].text in ("(", ","):
            cuts.append(_option_cut(stmt, i))
        elif tag == "ALTER TABLE" and not any(x.upper == "DETACH" for x in stmt[:i]):
            continue
        else:
            cuts.append((t.start, t.end))
        if tag != "ALTER TABLE":
            break
    for start, end in reversed(cuts):
        text = (
            text[:start].rstrip(" \t") + (" " if end < len(text) else "") + text[end:].lstrip(" \t")
        )
    return text


def _option_cut(stmt: list[Token], i: int) -> tuple[int, int]:
    """REINDEX (CONCURRENTLY [, ...]): the span that goes, the list too if it empties."""
    prev, nxt = stmt[i - 1], stmt[i + 1] if i + 1 < len(stmt) else None
    if prev.text == "(" and nxt is not None and nxt.text == ")":
        return prev.start, nxt.end
    if nxt is not None and nxt.text == ",":
        return stmt[i].start, nxt.end
    return prev.start, stmt[i].end  # ", CONCURRENTLY"


def _source_side(m: DdlMessage, stmts: list[list[Token]], cfg: Config) -> Verdict:
    """Publications and subscriptions are the source's: never run; report the
    included tables added to one of ours."""
    ignored = "a publication or subscription is the source's own object"
    if m.tag.upper() != "ALTER PUBLICATION" or len(stmts) != 1:
        return Verdict(ignored=ignored)
    added = published_tables(m, stmts[0], cfg.source.publications)
    return Verdict(ignored=ignored, published=tuple(t for t in added if cfg.tables.includes(*t)))


def published_tables(m: DdlMessage, stmt: list[Token], ours: list[str]) -> list[tuple[str, str]]:
    """The tables ``ALTER PUBLICATION p ADD|SET TABLE ...`` adds to ``p`` (one of ``ours``)."""
    said = words(stmt, 3)
    if len(said) < 2 or len(stmt) < 4 or unquote(stmt[2]) not in ours:
        return []
    if stmt[3].upper not in ("ADD", "SET"):
        return []
    found: list[tuple[str, str]] = []
    for o in m.objects:
        if o.kind.lower() == "publication relation" and " in publication " in o.identity:
            parts = identity_parts(o.identity.rsplit(" in publication ", 1)[0])
            if len(parts) == 2:
                found.append((parts[0], parts[1]))
    if found:
        return found
    return _named_tables(stmt[4:], m.search_path)


def _named_tables(rest: list[Token], search_path: str) -> list[tuple[str, str]]:
    """TABLE [ONLY] a [*] [(cols)] [WHERE (...)], TABLE b ...: the tables' names."""
    default = next(
        (s.strip().strip('"') for s in search_path.split(",") if "$user" not in s), "public"
    )
    found: list[tuple[str, str]] = []
    depth, expect = 0, False
    i = 0
    while i < len(rest):
        t = rest[i]
        if t.text == "(":
            depth += 1
        elif t.text == ")":
            depth -= 1
        elif depth == 0 and t.upper in ("TABLE", ","):
            expect = True
        elif depth == 0 and expect and t.upper != "ONLY" and t.kind in ("word", "ident"):
            expect = False
            if i + 2 < len(rest) and rest[i + 1].text == ".":
                found.append((unquote(t), unquote(rest[i + 2])))
                i += 2
            else:
                found.append((default, unquote(t)))
        i += 1
    return found


def _show(t: tuple[str, str]) -> str:
    return f"{t[0]}.{t[1]}"
