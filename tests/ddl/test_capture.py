"""The source's event trigger (applier ddl install): what each DDL statement emits, read back
from a pgoutput slot and decoded with applier.ddl.message.decode, on PostgreSQL 15 and 18."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from ddlkit import DEFAULT_PATH, Source, role, source_db

from applier.ddl.message import DdlMessage, DdlObject
from applier.localpg import LocalCluster


@pytest.fixture
def src(publisher: tuple[LocalCluster, str], tmp_path: Path) -> Iterator[Source]:
    """A source database (15 or 18) with the capture installed and a slot made before it."""
    cluster, db = publisher
    with source_db(cluster, db, tmp_path) as s:
        s.install()
        yield s


def obj(kind: str, identity: str, *, dropped: bool = False) -> DdlObject:
    schema = None if kind == "schema" else identity.rsplit(".", 2 if "column" in kind else 1)[0]
    return DdlObject(kind, schema, identity, dropped)


def msg(tag: str, statement: str, *objects: DdlObject) -> DdlMessage:
    return DdlMessage(tag, statement, DEFAULT_PATH, tuple(objects), "trigger")


def test_install_emits_nothing_and_each_statement_is_one_message(src: Source) -> None:
    """Tables, columns, defaults, constraints, indexes, types, enum values, sequences and
    schemas: one message each, with what the statement made, altered or dropped."""
    statements = [
        ("CREATE TABLE", "CREATE TABLE t (id serial PRIMARY KEY, v text)",
         obj("sequence", "public.t_id_seq"), obj("table", "public.t"),
         obj("index", "public.t_pkey")),
        ("ALTER TABLE", "ALTER TABLE t ADD COLUMN w int DEFAULT 3, DROP COLUMN v",
         obj("table", "public.t"), obj("table column", "public.t.v", dropped=True)),
        ("ALTER TABLE", "ALTER TABLE t RENAME COLUMN w TO x", obj("table column", "public.t.x")),
        ("ALTER TABLE", "ALTER TABLE t ALTER COLUMN x TYPE bigint", obj("table", "public.t")),
        ("ALTER TABLE", "ALTER TABLE t ADD CONSTRAINT x_pos CHECK (x > 0)",
         obj("table", "public.t")),
        ("CREATE INDEX", "CREATE INDEX t_x ON t (x)", obj("index", "public.t_x")),
        ("DROP INDEX", "DROP INDEX t_x", obj("index", "public.t_x", dropped=True)),
        ("CREATE TYPE", "CREATE TYPE mood AS ENUM ('sad')", obj("type", "public.mood")),
        ("ALTER TYPE", "ALTER TYPE mood ADD VALUE 'happy'", obj("type", "public.mood")),
        ("CREATE SEQUENCE", "CREATE SEQUENCE s", obj("sequence", "public.s")),
        ("ALTER SEQUENCE", "ALTER SEQUENCE s INCREMENT 5", obj("sequence", "public.s")),
        ("CREATE SCHEMA", "CREATE SCHEMA app", obj("schema", "app")),
        ("CREATE TABLE", "CREATE TABLE app.u (i int)", obj("table", "app.u")),
        ("DROP SCHEMA", "DROP SCHEMA app CASCADE",
         obj("schema", "app", dropped=True), obj("table", "app.u", dropped=True)),
        ("DROP TABLE", "DROP TABLE t", obj("table", "public.t", dropped=True)),
        ("DROP TYPE", "DROP TYPE mood", obj("type", "public.mood", dropped=True)),
        ("DROP SEQUENCE", "DROP SEQUENCE s", obj("sequence", "public.s", dropped=True)),
    ]  # fmt: skip
    assert src.stream() == []  # the install itself: not a transaction in the stream
    src.run(*(s for _, s, *_ in statements))
    assert src.messages() == [msg(tag, s, *objects) for tag, s, *objects in statements]


def test_the_message_names_the_subtransaction_it_was_written_in(src: Source) -> None:
    """pgoutput sends a message with the top-level xid: the content carries the xid of the
    capture's own subtransaction (a child of the user's savepoint), not the top level's."""
    with src.conn(autocommit=False) as c:
        top = c.execute("SELECT pg_catalog.pg_current_xact_id()::text::bigint").fetchone()
        c.execute("SAVEPOINT s")
        c.execute("CREATE TABLE t (id int)")
        c.commit()
    assert top is not None
    (m,) = src.messages()
    assert m.subxact is not None and m.subxact > top[0], (m.subxact, top)


def test_the_message_sits_among_the_changes_of_its_transaction(src: Source) -> None:
    src.run("CREATE TABLE t (id int PRIMARY KEY)")
    src.stream()
    with src.conn(autocommit=False) as c:
        c.execute("INSERT INTO t VALUES (1)")
        c.execute("ALTER TABLE t ADD COLUMN v text")
        c.execute("INSERT INTO t VALUES (2, 'b')")
    assert src.stream() == [
        "begin",
        "insert",
        msg("ALTER TABLE", "ALTER TABLE t ADD COLUMN v text", obj("table", "public.t")),
        "insert",
        "commit",
    ]


def test_ddl_in_a_savepoint_stays_before_the_next_change(src: Source) -> None:
    """The message's subtransaction is merged into its transaction's changes by LSN, and a
    message counts at its end: the empty message after it keeps the next change behind."""
    src.run("CREATE TABLE t (id int PRIMARY KEY)")
    src.stream()
    with src.conn(autocommit=False) as c:
        c.execute("SAVEPOINT a")
        c.execute("ALTER TABLE t ADD COLUMN v text")
        c.execute("RELEASE a")
        c.execute("INSERT INTO t VALUES (2, 'b')")
    assert src.stream() == [
        "begin",
        msg("ALTER TABLE", "ALTER TABLE t ADD COLUMN v text", obj("table", "public.t")),
        "insert",
        "commit",
    ]


def test_create_index_concurrently_is_one_message_in_its_last_transaction(src: Source) -> None:
    """CIC runs three transactions; the trigger fires in the last, once, with the statement as
    written (the worker decides how to run it on the target)."""
    src.run("CREATE TABLE t (id int PRIMARY KEY, v text)")
    src.stream()
    src.run("CREATE INDEX CONCURRENTLY t_v ON t (v)", "DROP INDEX CONCURRENTLY t_v")
    assert src.stream() == [
        "begin",
        msg("CREATE INDEX", "CREATE INDEX CONCURRENTLY t_v ON t (v)", obj("index", "public.t_v")),
        "commit",
        "begin",
        msg("DROP INDEX", "DROP INDEX CONCURRENTLY t_v", obj("index", "public.t_v", dropped=True)),
        "commit",
    ]


def test_temporary_objects_are_never_emitted(src: Source) -> None:
    """Not their creation, change or drop; a permanent table dropped with a temporary view on
    it is emitted without the view."""
    src.run("CREATE TABLE p (i int)")
    src.stream()
    with src.conn() as c:  # one session: its temporary objects live as long as it
        for s in [
            "CREATE TEMP TABLE tt (id int PRIMARY KEY)",
            "ALTER TABLE tt ADD COLUMN v text",
            "CREATE INDEX ON tt (v)",
            "CREATE TEMP SEQUENCE ts",
            "CREATE VIEW tv AS SELECT * FROM tt",  # temporary: it reads a temporary table
            "COMMENT ON TABLE tt IS 'x'",
            "DROP TABLE tt CASCADE",
            "DROP SEQUENCE ts",
            "CREATE TEMP VIEW pv AS SELECT * FROM p",
            "DROP TABLE p CASCADE",
        ]:
            c.execute(s)
    assert src.messages() == [
        msg("DROP TABLE", "DROP TABLE p CASCADE", obj("table", "public.p", dropped=True))
    ]


def test_an_extension_is_one_message_not_one_per_statement_of_its_script(src: Source) -> None:
    src.run("CREATE EXTENSION citext", "DROP EXTENSION citext")
    assert src.messages() == [
        msg("CREATE EXTENSION", "CREATE EXTENSION citext", DdlObject("extension", None, "citext")),
        msg(
            "DROP EXTENSION",
            "DROP EXTENSION citext",
            DdlObject("extension", None, "citext", dropped=True),
        ),
    ]


def test_a_session_with_a_replication_origin_emits_nothing(src: Source) -> None:
    """Two-way setups: what a replication worker applied is not sent back (a non-superuser's
    session is asked too: the check is the capture's own SECURITY DEFINER function)."""
    with src.conn() as c:
        c.execute("SELECT pg_replication_origin_create('ddl_test_origin')")
        try:
            c.execute("SELECT pg_replication_origin_session_setup('ddl_test_origin')")
            c.execute("CREATE TABLE applied (i int)")
            c.execute("SELECT pg_replication_origin_session_reset()")
            c.execute("SET session_replication_role = replica")  # applier's worker sets it
            c.execute("CREATE TABLE replica (i int)")
            c.execute("RESET session_replication_role")
            c.execute("CREATE TABLE mine (i int)")
        finally:
            c.execute("SELECT pg_replication_origin_drop('ddl_test_origin')")
    with role(src) as r:
        src.run("CREATE TABLE theirs (i int)", user=r)
    assert src.messages() == [
        msg("CREATE TABLE", "CREATE TABLE mine (i int)", obj("table", "public.mine")),
        msg("CREATE TABLE", "CREATE TABLE theirs (i int)", obj("table", "public.theirs")),
    ]


def test_capture_off_for_a_transaction_and_applier_schemas_emit_nothing(src: Source) -> None:
    with src.conn(autocommit=False) as c:
        c.execute("SET LOCAL applier_ddl.capture = off")
        c.execute("CREATE TABLE source_only (i int)")
    src.run(
        "CREATE SCHEMA applier",
        "CREATE TABLE applier.worker_status (i int)",
        "CREATE TABLE after_off (i int)",
    )
    assert src.messages() == [
        msg("CREATE TABLE", "CREATE TABLE after_off (i int)", obj("table", "public.after_off"))
    ]


def test_the_users_ddl_never_fails_because_of_the_capture(src: Source) -> None:
    """A capture that cannot emit warns and lets the statement run: a setting of the capture's
    own holding nonsense, a role that may not reach the capture's schema."""
    warnings: list[str] = []
    with src.conn(autocommit=False) as c:
        c.add_notice_handler(lambda d: warnings.append(str(d.message_primary)))
        c.execute("SET LOCAL applier_ddl.dropped = 'not json'")
        c.execute("CREATE TABLE t1 (i int)")
        c.execute("DROP TABLE t1")
    src.quietly("REVOKE USAGE ON SCHEMA applier_ddl FROM PUBLIC")
    with role(src) as r, psycopg.connect(src.cluster.dsn(src.db, r), autocommit=True) as c:
        c.add_notice_handler(lambda d: warnings.append(str(d.message_primary)))
        c.execute("CREATE TABLE t2 (i int)")
        c.execute("ALTER TABLE t2 ADD COLUMN j int")
        c.execute("DROP TABLE t2")
    assert [w.split(": ")[:2] for w in warnings] == [
        ["applier", "this CREATE TABLE was not captured for the target"],
        ["applier", "this CREATE TABLE was not captured for the target"],
        ["applier", "this ALTER TABLE was not captured for the target"],
        ["applier", "what this DROP TABLE dropped was not captured for the target"],
        ["applier", "this DROP TABLE was not captured for the target"],
    ]
    assert "permission denied for schema applier_ddl" in warnings[-1]
    # DROP TABLE t1 went out: the failed capture before it left nothing behind.
    assert src.messages() == [
        msg("DROP TABLE", "DROP TABLE t1", obj("table", "public.t1", dropped=True))
    ]


def test_emit_message_revoked_from_public_leaves_the_capture_working(src: Source) -> None:
    """Who may write an applier.ddl message can be narrowed: the capture emits as its owner."""
    flush = ", boolean" if src.cluster.version >= 17 else ""  # 17 added an argument
    src.quietly(
        f"REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text{flush}), "
        f"pg_logical_emit_message(boolean, text, bytea{flush}) FROM PUBLIC"
    )
    with role(src) as r, psycopg.connect(src.cluster.dsn(src.db, r), autocommit=True) as c:
        c.execute("CREATE TABLE t (i int)")
        for content in ("'DROP TABLE x'", "'DROP TABLE x'::bytea"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(f"SELECT pg_logical_emit_message(true, 'applier.ddl', {content})")
    created = msg("CREATE TABLE", "CREATE TABLE t (i int)", obj("table", "public.t"))
    assert src.messages() == [created]
