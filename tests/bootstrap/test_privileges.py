"""Privileges and client tools (issue 31, items 4 and 9): a bootstrap by roles with
only the README's grants is refused in one line naming every GRANT to run, before
the slot, the applier schema or a table exists; with those GRANTs it works. A
source newer than every pg_dump found is refused in one line naming the version
needed and where to put it."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Pair

from applier.bootstrap import clients
from applier.bootstrap import schema as ddl
from applier.bootstrap.job import run_bootstrap
from applier.config import load_config
from applier.errors import EXIT_PERMANENT, EXIT_USAGE, PermanentError

# Roles that must create the applier schema themselves, or be refused before it
# exists: the target starts as a new one.
pytestmark = pytest.mark.bare_target

#: The README's grants before issue 31 ("### Privileges"), word for word.
README_SOURCE = (
    "CREATE ROLE {r} LOGIN REPLICATION; GRANT SELECT ON ALL TABLES IN SCHEMA public TO {r};"
)
README_TARGET = (
    "CREATE ROLE {r} LOGIN; GRANT CREATE ON DATABASE {db} TO {r};"
    "GRANT EXECUTE ON FUNCTION pg_replication_origin_create(text),"
    " pg_replication_origin_session_setup(text),"
    " pg_replication_origin_xact_setup(pg_lsn, timestamptz), pg_replication_origin_xact_reset(),"
    " pg_replication_origin_advance(text, pg_lsn), pg_replication_origin_progress(text, boolean),"
    " pg_replication_origin_session_progress(boolean), pg_replication_origin_session_reset()"
    " TO {r};"
    "GRANT SET ON PARAMETER session_replication_role TO {r};"
)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", *args], capture_output=True, text=True, timeout=300
    )


def add_role(pair: Pair, side: str, ddl_text: str) -> str:
    """A new login role on one side (dropped with everything it owns at the end)."""
    role = f"r{uuid.uuid4().hex[:8]}"
    cluster, db = (pair.pub, pair.pub_db) if side == "pub" else (pair.sub, pair.sub_db)
    cluster.execute(ddl_text.format(r=role, db=db), db)

    def drop() -> None:
        cluster.execute(f"DROP OWNED BY {role}", db)
        cluster.execute(f"DROP ROLE {role}")

    pair.cleanup.append(drop)
    return role


def error_lines(stderr: str) -> list[str]:
    """The lines of a command's fatal error (the log's other lines are debug/info)."""
    return [ln for ln in stderr.splitlines() if "GRANT" in ln or "error" in ln.lower()[:40]]


def grants_for(line: str, side: str) -> str:
    """The GRANT statements the refusal gives for one server ("on the source: ...")."""
    m = re.search(rf"on the {side}: (.*?)(?: and on the (?:source|target): |$)", line)
    assert m, f"no GRANTs for the {side} in: {line}"
    return m.group(1)


def nothing_created(pair: Pair) -> None:
    slots = f"SELECT slot_name FROM pg_replication_slots WHERE slot_name = '{pair.slot}'"
    assert pair.pub_exec(slots) == []
    assert pair.sub_exec("SELECT nspname FROM pg_namespace WHERE nspname = 'applier'") == []
    assert pair.sub_exec("SELECT relname FROM pg_class WHERE relname = 'accounts'") == []


@pytest.mark.spark
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_bootstrap_with_the_readme_grants_is_refused_then_works(pair: Pair, spark: Any) -> None:
    pair.pub_exec(
        "CREATE TABLE accounts (id bigserial PRIMARY KEY, v text);"
        "INSERT INTO accounts (v) SELECT 'a' || g FROM generate_series(1, 300) g;"
        "CREATE PUBLICATION pub FOR TABLE accounts;"
    )
    src_role = add_role(pair, "pub", README_SOURCE)
    tgt_role = add_role(pair, "sub", README_TARGET)
    cfg = pair.write_config(
        source={"dsn": pair.pub.dsn(pair.pub_db, user=src_role)},
        target={"dsn": pair.sub.dsn(pair.sub_db, user=tgt_role)},
    )
    done = cli("bootstrap", "--config", str(cfg), "--quiet")
    assert done.returncode == EXIT_PERMANENT, done.stderr
    assert "Traceback" not in done.stderr
    lines = error_lines(done.stderr)
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert f'GRANT SELECT ON SEQUENCE "public"."accounts_id_seq" TO "{src_role}";' in line
    assert f'GRANT CREATE ON SCHEMA "public" TO "{tgt_role}";' in line
    nothing_created(pair)

    pair.pub_exec(grants_for(line, "source"))
    pair.sub_exec(grants_for(line, "target"))
    assert run_bootstrap(load_config(cfg), recreate_slot=False, truncate=False, quiet=True) == 0
    q = "SELECT count(*), max(id) FROM accounts"
    assert pair.sub_exec(q) == pair.pub_exec(q) == [(300, 300)]
    assert pair.sub_exec("SELECT last_value FROM accounts_id_seq") == [(300,)]


@pytest.mark.parametrize("any_pair", ["18-18"], indirect=True)
def test_configured_tools_older_than_the_source_are_refused(any_pair: Pair) -> None:
    pair = any_pair
    pair.pub_exec(
        "CREATE TABLE accounts (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE accounts"
    )
    old = "/usr/lib/postgresql/15/bin"
    cfg = pair.write_config(bootstrap={"client_bin_dir": old})
    done = cli("bootstrap", "--config", str(cfg), "--quiet")
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "Traceback" not in done.stderr
    line = [ln for ln in done.stderr.splitlines() if "pg_dump" in ln]
    assert len(line) == 1, done.stderr
    assert "18" in line[0] and old in line[0] and "client_bin_dir" in line[0], line[0]
    assert "postgresql-client-18" in line[0], line[0]
    nothing_created(pair)


@pytest.mark.parametrize("any_pair", ["18-18"], indirect=True)
def test_default_discovery_finds_tools_for_an_18_source(any_pair: Pair) -> None:
    pair = any_pair
    pair.pub_exec("CREATE TABLE accounts (id int PRIMARY KEY)")
    bindir = clients.pick(pair.pub_dsn, 18, None)
    assert clients.version_of(bindir) >= 18
    script = ddl.dump(pair.pub_dsn, [("public", "accounts")], "pre-data", None, bindir)
    assert "CREATE TABLE public.accounts" in script


def test_ssl_without_new_enough_tools_names_the_version() -> None:
    """The embedded 18 tools lack SSL and Debian's 15 are too old for an 18 source:
    a DSN asking for SSL gets the one-line refusal, not pg_dump's own message."""
    dsn = "host=127.0.0.1 port=1 dbname=x sslmode=require"
    if not any(clients.has_ssl(d) and clients.version_of(d) >= 18 for d in clients.candidates()):
        with pytest.raises(PermanentError, match="PostgreSQL 18 or newer") as refused:
            clients.pick(dsn, 18, None)
        assert "client_bin_dir" in str(refused.value) and "postgresql-client-18" in str(
            refused.value
        )
    else:  # a machine with SSL-capable 18 tools: they are picked
        assert clients.version_of(clients.pick(dsn, 18, None)) >= 18


def test_a_configured_directory_without_the_tools_is_a_config_error(tmp_path: Path) -> None:
    from applier.errors import ConfigError

    with pytest.raises(ConfigError, match="client_bin_dir"):
        clients.pick("dbname=x", 15, str(tmp_path))


def test_the_readme_lists_exactly_what_is_checked() -> None:
    """The README's "What each command checks" is applier.privileges' table, word for word."""
    from applier.privileges import describe

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("- **What each command checks**") :]
    section = section[: section.index("  Not checked before the start")]
    listed = [ln.removeprefix("  ") for ln in section.splitlines()[3:]]
    assert [ln for ln in listed if ln] == [ln for ln in describe() if ln]


def _check_as(pair: Pair, command: str, scope: Any, src_role: str, tgt_role: str) -> None:
    from applier.privileges import check

    with (
        psycopg.connect(pair.pub.dsn(pair.pub_db, user=src_role), autocommit=True) as src,
        psycopg.connect(pair.sub.dsn(pair.sub_db, user=tgt_role), autocommit=True) as tgt,
    ):
        check(command, scope, source=src, target=tgt)


def test_verify_needs_select_on_both_sides(pair: Pair) -> None:
    from applier.privileges import MissingPrivileges, Scope

    pair.both("CREATE SCHEMA app; CREATE TABLE app.t (id int PRIMARY KEY)")
    src = add_role(pair, "pub", "CREATE ROLE {r} LOGIN")
    tgt = add_role(pair, "sub", "CREATE ROLE {r} LOGIN")
    scope = Scope(tables=[("app", "t")])
    with pytest.raises(MissingPrivileges) as refused:
        _check_as(pair, "verify", scope, src, tgt)
    line = str(refused.value)
    assert "\n" not in line
    for side, role in (("source", src), ("target", tgt)):
        grants = grants_for(line, side)
        assert f'GRANT USAGE ON SCHEMA "app" TO "{role}";' in grants
        assert f'GRANT SELECT ON TABLE "app"."t" TO "{role}";' in grants
    pair.pub_exec(grants_for(line, "source"))
    pair.sub_exec(grants_for(line, "target"))
    _check_as(pair, "verify", scope, src, tgt)


def test_run_needs_the_applier_schema_another_role_made(pair: Pair) -> None:
    """The applier schema made by a superuser: `run` needs USAGE on it and its tables'
    and sequences' privileges, granted schema-wide in three statements."""
    from applier.privileges import MissingPrivileges, Scope, check
    from applier.schema import upgrade_target

    upgrade_target(pair.sub_dsn)
    role = add_role(
        pair,
        "sub",
        "CREATE ROLE {r} LOGIN; GRANT SET ON PARAMETER session_replication_role TO {r};"
        "GRANT EXECUTE ON FUNCTION pg_replication_origin_create(text),"
        " pg_replication_origin_session_setup(text), pg_replication_origin_session_reset(),"
        " pg_replication_origin_session_progress(boolean),"
        " pg_replication_origin_xact_setup(pg_lsn, timestamptz),"
        " pg_replication_origin_xact_reset(), pg_replication_origin_advance(text, pg_lsn),"
        " pg_replication_origin_progress(text, boolean) TO {r}",
    )
    with psycopg.connect(pair.sub.dsn(pair.sub_db, user=role), autocommit=True) as tgt:
        with pytest.raises(MissingPrivileges) as refused:
            check("run", Scope(), target=tgt)
        grants = grants_for(str(refused.value), "target")
        assert grants == (
            f'GRANT USAGE ON SCHEMA "applier" TO "{role}"; '
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
            f'"applier" TO "{role}"; '
            f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "applier" TO "{role}";'
        )
        pair.sub_exec(grants)
        check("run", Scope(), target=tgt)


def test_scope_is_found_without_usage_on_the_schema(pair: Pair) -> None:
    """A source role without USAGE on the tables' schema cannot even name them (a cast
    to regclass needs it): the scope is found by OID, the same as discovery's, and
    the refusal names the schema, the tables and the sequences."""
    from applier.bootstrap.plan import discover, published_tables
    from applier.bootstrap.sequences import sequences_of
    from applier.privileges import MissingPrivileges, check, scope_of

    pair.pub_exec(
        "CREATE SCHEMA app; CREATE SEQUENCE app.shared;"
        "CREATE TABLE app.p (id bigserial, r text, n int DEFAULT nextval('app.shared'),"
        " PRIMARY KEY (id, r)) PARTITION BY LIST (r);"
        "CREATE TABLE app.p_eu PARTITION OF app.p FOR VALUES IN ('eu');"
        "CREATE PUBLICATION pub FOR TABLE app.p"
    )
    cfg = pair.config()
    role = add_role(pair, "pub", "CREATE ROLE {r} LOGIN REPLICATION")
    with pair.pub_conn() as su:
        tables = discover(su, cfg).ddl_tables
        expected = (sorted(tables), sorted(sequences_of(su, tables)))
    with psycopg.connect(pair.pub.dsn(pair.pub_db, user=role), autocommit=True) as src:
        scope = scope_of(src, published_tables(src, cfg), creates=True)
        assert (sorted(scope.tables), sorted(scope.sequences)) == expected
        with pytest.raises(MissingPrivileges) as refused:
            check("bootstrap", scope, source=src)
    grants = grants_for(str(refused.value), "source")
    assert grants == (
        f'GRANT USAGE ON SCHEMA "app" TO "{role}"; '
        f'GRANT SELECT ON TABLE "app"."p", "app"."p_eu" TO "{role}"; '
        f'GRANT SELECT ON SEQUENCE "app"."p_id_seq", "app"."shared" TO "{role}";'
    )


def _readme_sql(after: str) -> str:
    """The ```sql block of the README's Privileges section that follows ``after``."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("### Privileges") :]
    block = section[section.index(after) :]
    block = block[block.index("```sql") + len("```sql") :]
    return block[: block.index("```")]


def test_the_readmes_grants_pass_the_checks(pair: Pair) -> None:
    """Roles made with exactly the README's SQL pass bootstrap's and run's checks."""
    from applier.bootstrap.plan import published_tables
    from applier.privileges import Scope, check, scope_of

    pair.pub_exec(
        "CREATE TABLE accounts (id bigserial PRIMARY KEY, v text);"
        "CREATE PUBLICATION pub FOR TABLE accounts"
    )
    src_sql = _readme_sql("- **Source**").replace("replicator", "{r}")
    tgt_sql = (
        _readme_sql("- **Target**")
        .replace("ROLE applier", "ROLE {r}")
        .replace("TO applier", "TO {r}")
        .replace("appdb", "{db}")
    )
    assert "{r}" in src_sql and "{db}" in tgt_sql
    src_role, tgt_role = add_role(pair, "pub", src_sql), add_role(pair, "sub", tgt_sql)
    cfg = pair.config()
    with (
        psycopg.connect(pair.pub.dsn(pair.pub_db, user=src_role), autocommit=True) as src,
        psycopg.connect(pair.sub.dsn(pair.sub_db, user=tgt_role), autocommit=True) as tgt,
    ):
        scope = scope_of(src, published_tables(src, cfg), creates=True)
        assert scope.sequences == [("public", "accounts_id_seq")]
        check("bootstrap", scope, source=src, target=tgt)
        check("sync-tables", scope, source=src, target=tgt)
        check("run", Scope(), target=tgt)
