"""applier.pgconn: what goes in the startup packet, and a server too old for a setting."""

from __future__ import annotations

import pytest
from conftest import Pair
from psycopg.conninfo import conninfo_to_dict

from applier import pgconn


def test_settings_per_side_and_version() -> None:
    old = pgconn.settings("source", 130000)
    assert old["default_transaction_read_only"] == "on" and old["search_path"] == "pg_catalog"
    assert "idle_session_timeout" not in old and "transaction_timeout" not in old
    new = pgconn.settings("target", 170000, {"statement_timeout": "5000"})
    assert new["default_transaction_read_only"] == "off"
    assert new["transaction_timeout"] == "0" and new["statement_timeout"] == "5000"
    assert pgconn.settings("target", None).keys() >= {"idle_session_timeout", "transaction_timeout"}


def test_options_of_the_dsn_or_pgoptions_come_first(monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = {"default_transaction_isolation": "read committed", "search_path": "pg_catalog"}
    ours = r"-c default_transaction_isolation=read\ committed -c search_path=pg_catalog"
    opts = pgconn.startup_options("dbname=x options='-c work_mem=64MB'", pinned)
    assert opts == f"-c work_mem=64MB {ours}"
    monkeypatch.setenv("PGOPTIONS", "-c geqo=off")
    assert pgconn.startup_options("dbname=x", pinned) == f"-c geqo=off {ours}"
    ci = pgconn.pinned_conninfo("dbname=x", "source", server_version=150000)
    params = conninfo_to_dict(ci)
    assert params["client_encoding"] == "UTF8"
    assert str(params["options"]).startswith("-c geqo=off -c datestyle=ISO")
    assert "transaction_timeout" not in str(params["options"])


def test_a_server_without_a_setting_is_connected_to_without_it(pair: Pair) -> None:
    """PostgreSQL 15 refuses transaction_timeout at startup (FATAL): the first
    connection retries without it, and later ones know the version."""
    dsn = pair.pub_dsn + " application_name=pgconn_test"
    with pgconn.connect(dsn, side="source", purpose="pgconn test") as conn:
        assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("on",)
        assert conn.execute("SHOW search_path").fetchone() == ("pg_catalog",)
        version = conn.info.server_version
    assert pgconn.known_version(dsn) == version < 170000
    with pgconn.connect(
        dsn, side="source", purpose="pgconn test", extra={"lock_timeout": "7s"}
    ) as c2:
        assert c2.execute("SHOW lock_timeout").fetchone() == ("7s",)
        assert c2.execute("SHOW idle_session_timeout").fetchone() == ("0",)


def test_a_first_connection_leaves_no_fatal_on_an_older_server(pair: Pair) -> None:
    """The first connection to a DSN asks a server only for what every supported
    version has: a 15 server's log gets no FATAL for transaction_timeout (DBAs
    watch those logs), and an 18 target still gets it pinned on that connection,
    over a database default that would cut a long transaction."""
    for cluster, db, side in (
        (pair.pub, pair.pub_db, "source"),
        (pair.sub, pair.sub_db, "target"),
    ):
        dsn = cluster.dsn(db) + " application_name=pgconn_first"
        with cluster.connect(db) as admin:
            admin.autocommit = True
            if admin.info.server_version >= 170000:
                admin.execute(f'ALTER DATABASE "{db}" SET transaction_timeout = 1500')
        before = cluster.logfile.read_text(errors="replace")
        with pgconn.connect(dsn, side=side, purpose="pgconn first") as conn:  # type: ignore[arg-type]
            if conn.info.server_version >= 170000:
                assert conn.execute("SHOW transaction_timeout").fetchone() == ("0",)
            assert conn.execute("SHOW idle_session_timeout").fetchone() == ("0",)
        added = cluster.logfile.read_text(errors="replace")[len(before) :]
        assert "unrecognized configuration parameter" not in added
