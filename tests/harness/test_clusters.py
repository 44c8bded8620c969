"""The harness starts real clusters ready for logical decoding, for both versions."""

from __future__ import annotations

import subprocess

import pytest
from conftest import Pair

from applier.localpg import LocalCluster, fetched_installs, installed_bin_dirs
from applier.schema import current_revision, schema_at_head, script_head


def test_publisher_decodes_a_change_through_a_logical_slot(
    publisher: tuple[LocalCluster, str],
) -> None:
    cluster, db = publisher
    assert cluster.execute("SHOW wal_level") == [("logical",)]
    assert int(cluster.execute("SHOW max_prepared_transactions")[0][0]) > 0
    version = cluster.execute("SHOW server_version_num", db)[0][0]
    assert version.startswith(str(cluster.version))
    cluster.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t;", db
    )
    cluster.execute(f"SELECT pg_create_logical_replication_slot('h_{db}', 'pgoutput')", db)
    cluster.execute("INSERT INTO t VALUES (1, 'hello')", db)
    rows = cluster.execute(
        f"SELECT data FROM pg_logical_slot_peek_binary_changes('h_{db}', NULL, NULL, "
        "'proto_version', '1', 'publication_names', 'pub')",
        db,
    )
    kinds = [bytes(r[0])[:1] for r in rows]
    assert kinds == [b"B", b"R", b"I", b"C"]
    insert = bytes(rows[2][0])
    assert insert.endswith(b"t\x00\x00\x00\x05hello")


def test_pair_has_distinct_servers_and_fresh_databases(pair: Pair) -> None:
    assert pair.pub.port != pair.sub.port
    assert pair.pub_exec("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]
    assert pair.sub.execute("SHOW wal_level") == [("logical",)]
    assert int(pair.sub.execute("SHOW server_version_num")[0][0]) // 10000 == pair.sub.version


def test_pair_target_starts_at_the_schemas_head(pair: Pair) -> None:
    """Cloned from the cluster's migrated template: the worker's own check finds it at
    head (no migration to run), and it holds no rows of another test."""
    with pair.sub_conn() as conn:
        assert schema_at_head(conn)
    assert current_revision(pair.sub_dsn) == script_head()
    tables = [r[0] for r in pair.sub_exec(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'applier' ORDER BY 1"
    )]  # fmt: skip
    assert "worker_status" in tables
    for table in tables:
        if table != "alembic_version":
            assert pair.sub_exec(f"SELECT count(*) FROM applier.{table}") == [(0,)], table
    assert pair.sub_exec("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]


@pytest.mark.bare_target
def test_bare_target_pair_has_no_applier_schema(pair: Pair) -> None:
    assert pair.sub_exec("SELECT nspname FROM pg_namespace WHERE nspname = 'applier'") == []
    assert current_revision(pair.sub_dsn) is None


@pytest.mark.parametrize("publisher", [14, 16, 17], indirect=True)
def test_every_other_version_starts_and_decodes(publisher: tuple[LocalCluster, str]) -> None:
    """14, 16 and 17 (fetched by scripts/fetch-postgres) start as 15 and 18 do."""
    test_publisher_decodes_a_change_through_a_logical_slot(publisher)


def test_fetched_builds_are_client_candidates() -> None:
    """The bootstrap picks pg_dump/psql among installed_bin_dirs (bootstrap/clients.py):
    the fetched 14, 16 and 17 are there, and their clients have SSL (the wheel's 18 has not)."""
    dirs = installed_bin_dirs()
    for major in (14, 16, 17):
        install = fetched_installs()[major]
        assert install / "bin" in dirs
        out = subprocess.run(
            [str(install / "bin" / "pg_dump"), "--version"], capture_output=True, text=True
        ).stdout
        assert f") {major}." in out
        # SSL compiled in: the connection to a closed port fails on the port, not on SSL.
        probe = "host=127.0.0.1 port=1 sslmode=require connect_timeout=2 dbname=x"
        err = subprocess.run(
            [str(install / "bin" / "psql"), "-X", f"--dbname={probe}", "-c", "SELECT 1"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        ).stderr
        assert "not compiled in" not in err and "127.0.0.1" in err, err
