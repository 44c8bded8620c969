"""What the worker does with a captured statement: refused, ignored, or what it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from applier.config import Config, load_config
from applier.ddl.classify import classify
from applier.ddl.message import DdlMessage, DdlObject
from applier.ddl.sqltext import statements

T = DdlObject("table", "public", "public.t")
IDX = DdlObject("index", "public", "public.i")
X = DdlObject("table", "public", "public.x_log")


def config(tmp_path: Path, extra: str = "") -> Config:
    path = tmp_path / "a.toml"
    path.write_text(
        '[source]\ndsn = "host=s"\npublications = ["pub"]\nslot = "s"\n'
        '[target]\ndsn = "host=t"\n'
        '[tables]\ninclude = ["public.*", "app.*"]\nexclude = ["public.x_*"]\n' + extra
    )
    return load_config(path)


def msg(
    statement: str, *objects: DdlObject, tag: str = "ALTER TABLE", via: str = "trigger"
) -> DdlMessage:
    return DdlMessage(tag, statement, "public", objects, via)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "ALTER TABLE t ADD c text DEFAULT ';'",
        'ALTER TABLE "a;b" ADD c int -- ; comment',
        "ALTER TABLE t ADD c text DEFAULT $x$;$x$ /* ; /* nested ; */ */",
        "ALTER TABLE t ADD c text DEFAULT E'\\';'",
        "ALTER TABLE t ADD c int;  ",
    ],
)
def test_one_statement_with_semicolons_inside_quotes_and_comments(
    tmp_path: Path, text: str
) -> None:
    v = classify(msg(text, T), config(tmp_path))
    assert v.runs and v.statement == text
    assert len(statements(text)) == 1


def test_a_sql_function_body_keeps_its_semicolons() -> None:
    text = (
        "CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; "
        "SELECT CASE WHEN true THEN 2 END; END"
    )
    assert len(statements(text)) == 1


@pytest.mark.parametrize(
    ("m", "says"),
    [
        (msg("ALTER TABLE t ADD a int; ALTER TABLE t ADD b int", T), "2 statements in one string"),
        (msg("CREATE TABLE t AS SELECT 1", T, tag="CREATE TABLE AS"), "CREATE TABLE AS"),
        (msg("SELECT 1 INTO t", T, tag="SELECT INTO"), "SELECT INTO"),
        (msg("DROP TABLE t, x_log", T, X, tag="DROP TABLE"), "excludes (public.x_log)"),
        (msg("SELECT migrate()", T), "a function or DO block ran ALTER TABLE"),
        (msg("DO $$BEGIN ALTER TABLE t ADD c int; END$$", T), "function or DO block"),
        (msg("ALTER TABLE t ADD c text DEFAULT 'x", T), "cannot be read"),
    ],
)
def test_refusals_say_why(tmp_path: Path, m: DdlMessage, says: str) -> None:
    v = classify(m, config(tmp_path))
    assert v.refusal is not None and says in v.refusal, v
    assert not v.runs


def test_from_functions_when_allowed(tmp_path: Path) -> None:
    cfg = config(tmp_path, "[ddl]\nallow_from_functions = true\n")
    v = classify(msg("SELECT migrate()", T), cfg)
    assert v.runs and v.statement == "SELECT migrate()"
    assert v.from_function
    assert not classify(msg("ALTER TABLE t ADD c int", T), cfg).from_function


@pytest.mark.parametrize(
    ("m", "why"),
    [
        (msg("CREATE TEMP TABLE tt (a int)", tag="CREATE TABLE"), "none of its objects"),
        (msg("DROP TABLE tt", DdlObject("table", "pg_temp_3", "pg_temp.tt")), "temporary"),
        (msg("ALTER TABLE x_log ADD c int", X), "none of its objects"),
        (msg("ALTER TABLE other.t ADD c int", DdlObject("table", "other", "other.t")), "none"),
        (msg("CREATE TYPE other.e AS ENUM ()", DdlObject("type", "other", "other.e")), "none"),
        (
            msg("ALTER PUBLICATION pub ADD TABLE t", tag="ALTER PUBLICATION"),
            "the source's own object",
        ),
        (msg("CREATE PUBLICATION p2", tag="CREATE PUBLICATION"), "the source's own object"),
    ],
)
def test_ignored(tmp_path: Path, m: DdlMessage, why: str) -> None:
    v = classify(m, config(tmp_path))
    assert v.ignored is not None and why in v.ignored, v


@pytest.mark.parametrize(
    ("m", "runs"),
    [
        (msg("CREATE UNIQUE INDEX CONCURRENTLY i ON t (a)", IDX, tag="CREATE INDEX"),
         "CREATE UNIQUE INDEX i ON t (a)"),
        (msg("DROP INDEX CONCURRENTLY IF EXISTS i", DdlObject("index", "public", "public.i"),
             tag="DROP INDEX"), "DROP INDEX IF EXISTS i"),
        (msg("REINDEX (CONCURRENTLY) TABLE t", T, tag="REINDEX"), "REINDEX TABLE t"),
        (msg("REINDEX TABLE CONCURRENTLY t", T, tag="REINDEX"), "REINDEX TABLE t"),
        (msg("ALTER TABLE p DETACH PARTITION t CONCURRENTLY", T),
         "ALTER TABLE p DETACH PARTITION t"),
        (msg("CREATE TYPE mood AS ENUM ('a')", DdlObject("type", "public", "public.mood"),
             tag="CREATE TYPE"), "CREATE TYPE mood AS ENUM ('a')"),
        (msg("CREATE SCHEMA app", DdlObject("schema", None, "app"), tag="CREATE SCHEMA"),
         "CREATE SCHEMA app"),
        (msg("create or replace function f() returns int as $$select 1$$ language sql",
             DdlObject("function", "public", "public.f()"), tag="CREATE FUNCTION"),
         "create or replace function f() returns int as $$select 1$$ language sql"),
        (msg("ALTER TABLE t RENAME COLUMN a TO b",
             DdlObject("table column", "public", "public.t.b")),
         "ALTER TABLE t RENAME COLUMN a TO b"),
        (msg("ALTER TABLE t ADD CONSTRAINT c CHECK (a > 0)",
             DdlObject("table constraint", "public", "c on public.t")),
         "ALTER TABLE t ADD CONSTRAINT c CHECK (a > 0)"),
        (msg("ALTER TABLE t ADD c int", via="run"), "ALTER TABLE t ADD c int"),
    ],
)  # fmt: skip
def test_what_the_target_runs(tmp_path: Path, m: DdlMessage, runs: str) -> None:
    v = classify(m, config(tmp_path))
    assert v.runs, v
    assert v.statement == runs


def test_an_index_on_an_excluded_table_is_not_ours(tmp_path: Path) -> None:
    m = msg("CREATE INDEX i ON public.x_log (a)", DdlObject("index", "public", "public.i"),
            tag="CREATE INDEX")  # fmt: skip
    assert classify(m, config(tmp_path)).ignored is not None


def test_tables_added_to_our_publication(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    by_objects = msg(
        "ALTER PUBLICATION pub ADD TABLE t, x_log",
        DdlObject("publication relation", None, "public.t in publication pub"),
        DdlObject("publication relation", None, "public.x_log in publication pub"),
        tag="ALTER PUBLICATION",
    )
    assert classify(by_objects, cfg).published == (("public", "t"),)
    by_text = msg(
        'ALTER PUBLICATION pub ADD TABLE ONLY app."T" (a, b) WHERE (a > 0), TABLE t2',
        tag="ALTER PUBLICATION",
    )
    assert classify(by_text, cfg).published == (("app", "T"), ("public", "t2"))
    other = msg("ALTER PUBLICATION other ADD TABLE t", tag="ALTER PUBLICATION")
    assert classify(other, cfg).published == ()
