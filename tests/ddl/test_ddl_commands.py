"""``applier ddl install / uninstall / run`` and ``status``'s capture line, as the CLI runs them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from ddlkit import DEFAULT_PATH, Source, cli, fatal_lines, role, source_db

from applier.ddl.capture import CAPTURE_VERSION
from applier.ddl.message import DdlMessage, DdlObject
from applier.localpg import LocalCluster


@pytest.fixture
def src(publisher: tuple[LocalCluster, str], tmp_path: Path) -> Iterator[Source]:
    """A source database (15 or 18) with a slot, no capture installed."""
    cluster, db = publisher
    with source_db(cluster, db, tmp_path) as s:
        yield s


def leftovers(src: Source) -> list[str]:
    """What of the capture the database has: the schema, its functions, the event triggers."""
    rows = src.conn().execute(
        "SELECT 'schema ' || nspname FROM pg_namespace WHERE nspname = 'applier_ddl' "
        "UNION ALL SELECT 'function ' || p.oid::regprocedure FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'applier_ddl' "
        "UNION ALL SELECT 'event trigger ' || evtname FROM pg_event_trigger ORDER BY 1"
    )
    return [r[0] for r in rows.fetchall()]


def capture_status(src: Source) -> dict[str, object]:
    done = cli("status", "--config", src.config(), "--json")
    assert done.returncode == 4, done.stderr  # the slot is there, no worker runs: that verdict
    status = json.loads(done.stdout)["ddl_capture"]
    assert isinstance(status, dict)
    return status


def test_install_twice_then_uninstall_twice(src: Source) -> None:
    cfg = src.config()
    first, second = cli("ddl", "install", "--config", cfg), cli("ddl", "install", "--config", cfg)
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert f"installed DDL capture version {CAPTURE_VERSION} in the database {src.db}" in (
        first.stderr
    )
    assert f"replaced DDL capture version {CAPTURE_VERSION} (the same version" in second.stderr
    assert leftovers(src) == [
        "event trigger applier_ddl_command_end",
        "event trigger applier_ddl_sql_drop",
        "function applier_ddl.command_end(text,text)",
        "function applier_ddl.emit_run(bytea)",
        "function applier_ddl.hmac(bytea,bytea)",
        "function applier_ddl.keep(jsonb)",
        "function applier_ddl.on_ddl_command_end()",
        "function applier_ddl.on_sql_drop()",
        "function applier_ddl.secret()",
        "function applier_ddl.signed(bytea)",
        "function applier_ddl.sql_drop(text)",
        "function applier_ddl.verify(bytea,text)",
        "function applier_ddl.version()",
        "schema applier_ddl",
    ]
    assert capture_status(src) == {
        "installed": True, "version": CAPTURE_VERSION, "enabled": True,
        "current_version": CAPTURE_VERSION, "summary": f"installed, version {CAPTURE_VERSION}",
    }  # fmt: skip
    src.run("CREATE TABLE t (i int)")
    assert len(src.messages()) == 1  # replaced, not doubled

    removed = cli("ddl", "uninstall", "--config", cfg)
    assert removed.returncode == 0, removed.stderr
    assert f"removed DDL capture from the database {src.db}" in removed.stderr
    assert leftovers(src) == []
    again = cli("ddl", "uninstall", "--config", cfg)
    assert again.returncode == 0, again.stderr
    assert "DDL capture is not installed in the database" in again.stderr
    assert capture_status(src)["summary"] == "not installed (applier ddl install captures DDL)"
    src.run("DROP TABLE t")
    assert src.messages() == []


def test_install_upgrades_an_older_version_and_refuses_a_newer(src: Source) -> None:
    cfg = src.config()
    src.install()
    src.run(
        "CREATE OR REPLACE FUNCTION applier_ddl.version() RETURNS integer LANGUAGE sql "
        "AS 'SELECT 0'"
    )
    text = cli("status", "--config", cfg)  # the table's row, as a person reads it
    assert text.returncode == 4, text.stderr
    [row] = [ln for ln in text.stdout.splitlines() if "ddl capture" in ln]
    assert f"installed, version 0 (applier ddl install upgrades it to {CAPTURE_VERSION})" in row
    upgraded = cli("ddl", "install", "--config", cfg)
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"upgraded DDL capture from version 0 to {CAPTURE_VERSION}" in upgraded.stderr
    newer = CAPTURE_VERSION + 1
    src.run(
        "CREATE OR REPLACE FUNCTION applier_ddl.version() RETURNS integer LANGUAGE sql "
        f"AS 'SELECT {newer}'"
    )
    refused = cli("ddl", "install", "--config", cfg)
    assert refused.returncode == 3
    [line] = fatal_lines(refused.stderr)
    assert f"DDL capture version {newer}, newer than this applier's" in line


def test_a_non_superuser_is_refused_in_one_line_as_the_server_would(src: Source) -> None:
    """PostgreSQL (15 to 18) lets only a superuser create an event trigger: the role is told
    so before anything is made, and the server agrees."""
    with role(src, "CREATEDB CREATEROLE") as r:
        import psycopg

        with psycopg.connect(src.cluster.dsn(src.db, r), autocommit=True) as c:
            c.execute("CREATE FUNCTION f() RETURNS event_trigger LANGUAGE plpgsql AS 'BEGIN END'")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="superuser"):
                c.execute("CREATE EVENT TRIGGER e ON ddl_command_end EXECUTE FUNCTION f()")
        refused = cli("ddl", "install", "--config", src.config(user=r))
        assert refused.returncode == 3
        [line] = fatal_lines(refused.stderr)
        assert f'the source role "{r}" is not a superuser' in line
        assert "APPLIER_SOURCE__DSN" in line and "applier ddl run" in line
        assert leftovers(src) == []
        # The superuser's DSN for one run, the config's for the rest (README).
        env = {**os.environ, "APPLIER_SOURCE__DSN": src.cluster.dsn(src.db)}
        done = cli("ddl", "install", "--config", src.config(user=r), env=env)
        assert done.returncode == 0, done.stderr


def test_ddl_run_emits_once_with_or_without_the_capture(src: Source) -> None:
    """In the statement's transaction, via run; with the capture's event triggers on it is
    not emitted a second time, and the message carries the objects the capture found.
    Without the capture (its key, which signs the message) nothing is run."""
    cfg = src.config()
    create = "CREATE TABLE t (id int PRIMARY KEY)"
    refused = cli("ddl", "run", "--config", cfg, create)
    assert refused.returncode == 3, refused.stderr
    [line] = fatal_lines(refused.stderr)
    assert "has no applier_ddl.emit_run(bytea), which signs the message" in line
    assert "applier ddl install" in line
    assert src.conn().execute("SELECT to_regclass('t')").fetchone() == (None,)
    src.install()
    triggers = ("applier_ddl_command_end", "applier_ddl_sql_drop")
    src.run(*(f"ALTER EVENT TRIGGER {t} DISABLE" for t in triggers))
    ran = cli("ddl", "run", "--config", cfg, create)
    assert ran.returncode == 0, ran.stderr
    assert "CREATE TABLE ran on the source and was emitted at " in ran.stderr
    src.run(*(f"ALTER EVENT TRIGGER {t} ENABLE" for t in triggers))
    alter = "ALTER TABLE t ADD COLUMN v text"
    assert cli("ddl", "run", "--config", cfg, alter).returncode == 0
    path = cli("ddl", "run", "--config", cfg, "--search-path", "public", "CREATE INDEX ON t (v)")
    assert path.returncode == 0, path.stderr
    index = DdlObject("index", "public", "public.t_v_idx")
    assert src.stream() == [
        "begin",
        DdlMessage("CREATE TABLE", create, DEFAULT_PATH, (), "run"),
        "commit",
        "begin",
        DdlMessage(
            "ALTER TABLE", alter, DEFAULT_PATH, (DdlObject("table", "public", "public.t"),), "run"
        ),
        "commit",
        "begin",
        DdlMessage("CREATE INDEX", "CREATE INDEX ON t (v)", "public", (index,), "run"),
        "commit",
    ]


@pytest.mark.parametrize("publisher", [15], indirect=True)  # the same on 18: no version in it
@pytest.mark.parametrize(
    ("statement", "code", "says"),
    [
        (" ; ", 2, "the statement is empty"),
        ("ALTER TABLE t ADD a int; ALTER TABLE t ADD b int", 2, "more than one statement"),
        ("INSERT INTO t VALUES (1)", 2, "INSERT is not a schema change"),
        ("CREATE TABLE c AS SELECT 1 AS x", 2, "ran as SELECT, not a schema change"),
        ("ALTER TABLE nope ADD x int", 3, 'refused the statement: relation "nope" does not exist'),
        ("CREATE INDEX CONCURRENTLY ON t (id)", 3, "cannot run inside a transaction block"),
    ],
)
def test_ddl_run_refuses_in_one_line_and_changes_nothing(
    src: Source, statement: str, code: int, says: str
) -> None:
    src.install()
    src.run("CREATE TABLE t (id int PRIMARY KEY)")
    src.messages()  # the CREATE TABLE's
    done = cli("ddl", "run", "--config", src.config(), statement)
    assert done.returncode == code
    [line] = fatal_lines(done.stderr)
    assert says in line
    assert src.messages() == []
    assert src.conn().execute("SELECT count(*) FROM t").fetchone() == (0,)
    assert src.conn().execute("SELECT to_regclass('c')").fetchone() == (None,)


def test_ddl_run_needs_the_grant_to_sign(src: Source) -> None:
    """``ddl run`` signs through applier_ddl.emit_run: granted by install --run-role, kept
    by a reinstall; pg_logical_emit_message itself is not needed."""
    flush = ", boolean" if src.cluster.version >= 17 else ""
    fn = f"pg_catalog.pg_logical_emit_message(boolean, text, bytea{flush})"
    src.install()
    src.quietly(f"REVOKE EXECUTE ON FUNCTION {fn} FROM PUBLIC")
    try:
        with role(src) as r:
            cfg = src.config(user=r)
            done = cli("ddl", "run", "--config", cfg, "CREATE TABLE t (i int)")
            assert done.returncode == 3
            [line] = fatal_lines(done.stderr)
            assert f"the source role {r} may not sign applier's messages" in line
            assert f"--run-role {r}" in line
            assert src.conn().execute("SELECT to_regclass('t')").fetchone() == (None,)
            env = {**os.environ, "APPLIER_SOURCE__DSN": src.cluster.dsn(src.db)}
            granted = cli("ddl", "install", "--config", cfg, "--run-role", r, env=env)
            assert granted.returncode == 0, granted.stderr
            assert cli("ddl", "run", "--config", cfg, "CREATE TABLE t (i int)").returncode == 0
            src.install()  # a reinstall keeps the grant
            ran = cli("ddl", "run", "--config", cfg, "ALTER TABLE t ADD j int")
            assert ran.returncode == 0, ran.stderr
            assert [m.statement for m in src.messages()] == [
                "CREATE TABLE t (i int)",
                "ALTER TABLE t ADD j int",
            ]
            src.quietly("DROP TABLE t")
    finally:
        src.quietly(f"GRANT EXECUTE ON FUNCTION {fn} TO PUBLIC")
