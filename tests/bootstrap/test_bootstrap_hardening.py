"""Bootstrap hardening (issue 12): inheritance, refusals before truncation,
pinned session settings on both ends, tables without a replica identity."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import ONE_PAIR, Pair

from applier.bootstrap.job import run_bootstrap
from applier.errors import BootstrapError
from applier.schema import upgrade_target

pytestmark = pytest.mark.spark


def _only(pair: Pair, side: str, table: str) -> list[tuple[Any, ...]]:
    q = f"SELECT t::text FROM ONLY {table} t ORDER BY 1"
    return pair.pub_exec(q) if side == "pub" else pair.sub_exec(q)


@ONE_PAIR
def test_inheritance_parent_copied_without_its_children(pair: Pair, spark: Any) -> None:
    # Source: a parent and its inheritance child, both published (FOR TABLE
    # parent publishes its descendants too). Target: the parent exists with a
    # target-only child that holds rows the bootstrap must neither count nor empty.
    pair.pub_exec(
        "CREATE TABLE parent (id int PRIMARY KEY, v text);"
        "CREATE TABLE child (extra int) INHERITS (parent);"
        "ALTER TABLE child ADD PRIMARY KEY (id);"
        "INSERT INTO parent SELECT g, 'p' || g FROM generate_series(1, 50) g;"
        "INSERT INTO child SELECT g, 'c' || g, g FROM generate_series(101, 130) g;"
        "CREATE PUBLICATION pub FOR TABLE parent;"
    )
    pair.sub_exec(
        "CREATE TABLE parent (id int PRIMARY KEY, v text);"
        "CREATE TABLE local_child () INHERITS (parent);"
        "INSERT INTO local_child VALUES (900, 'mine'), (901, 'mine too');"
    )
    cfg = pair.config()
    # The parent itself is empty: its target-only child does not make it "not empty".
    assert run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True) == 0
    for table in ("parent", "child"):
        assert _only(pair, "sub", table) == _only(pair, "pub", table), table
    assert len(_only(pair, "sub", "parent")) == 50  # no child row landed in the parent
    kept = [(900, "mine"), (901, "mine too")]
    assert pair.sub_exec("SELECT * FROM local_child ORDER BY 1") == kept

    # Again with --truncate: parent and child are emptied and copied again,
    # the child that is not being copied keeps its rows.
    assert run_bootstrap(cfg, recreate_slot=True, truncate=True, quiet=True) == 0
    for table in ("parent", "child"):
        assert _only(pair, "sub", table) == _only(pair, "pub", table), table
    assert pair.sub_exec("SELECT * FROM local_child ORDER BY 1") == kept


@ONE_PAIR
def test_refusals_come_before_any_truncation(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec(
        "INSERT INTO t VALUES (1), (2); CREATE TABLE u (id int PRIMARY KEY, v text);"
        "CREATE PUBLICATION pub FOR TABLE t, u;"
    )
    pair.sub_exec("INSERT INTO t VALUES (9)")
    cfg = pair.config()
    # A target table lacking a column is refused before t is emptied.
    pair.sub_exec("CREATE TABLE u (id int PRIMARY KEY)")
    with pytest.raises(BootstrapError, match=r"public\.u lacks column\(s\) v"):
        run_bootstrap(cfg, recreate_slot=False, truncate=True, quiet=True)
    assert pair.sub_exec("SELECT id FROM t") == [(9,)]
    slots = f"SELECT slot_name FROM pg_replication_slots WHERE slot_name = '{pair.slot}'"
    assert pair.pub_exec(slots) == []  # and no slot was made
    # A slot that exists (e.g. made by `applier run`) is refused before t is emptied.
    pair.sub_exec("ALTER TABLE u ADD COLUMN v text")
    pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput')")
    with pytest.raises(BootstrapError, match="exists already"):
        run_bootstrap(cfg, recreate_slot=False, truncate=True, quiet=True)
    assert pair.sub_exec("SELECT id FROM t") == [(9,)]


@pytest.fixture
def latin1_source(pair: Pair) -> Iterator[str]:
    """A LATIN1 database on the pair's publisher whose defaults change every output format."""
    db = f"{pair.pub_db}_l1"
    pair.pub.execute(
        f"CREATE DATABASE {db} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    )
    try:
        pair.pub.execute(
            f"ALTER DATABASE {db} SET datestyle = 'SQL, DMY';"
            f"ALTER DATABASE {db} SET intervalstyle = 'sql_standard';"
            f"ALTER DATABASE {db} SET extra_float_digits = -15;"
            f"ALTER DATABASE {db} SET timezone = 'Asia/Kolkata';"
        )
        yield db
    finally:
        pair.pub.drop_database(db)


#: A session whose output formats no database default changes.
_PORTABLE_OPTIONS = (
    "-c datestyle=ISO -c intervalstyle=postgres -c extra_float_digits=3 -c timezone=UTC "
    "-c statement_timeout=0 -c default_transaction_isolation=read\\ committed"
)


def _query(dsn: str, q: str) -> list[tuple[Any, ...]]:
    # str, not bytes (LocalCluster.execute sends UTF-8 bytes): psycopg encodes
    # the statements in the session's client encoding, LATIN1 on the source.
    with psycopg.connect(dsn, autocommit=True, options=_PORTABLE_OPTIONS) as conn:
        cur = conn.execute(q)
        return cur.fetchall() if cur.description else []


def _portable(dsn: str, table: str) -> list[tuple[Any, ...]]:
    return _query(
        dsn,
        "SELECT id, t, d::text, ts::text, tz::text, iv::text, float8send(f8)::text, "
        f"float4send(f4)::text, m::text FROM {table} ORDER BY id",
    )


def test_sessions_are_pinned_on_both_ends(pair: Pair, latin1_source: str, spark: Any) -> None:
    src_dsn = pair.pub.dsn(latin1_source)
    assert _query(src_dsn, "SHOW server_encoding") == [("LATIN1",)]
    _query(
        src_dsn,
        "CREATE TYPE mood AS ENUM ('ok', 'café');"
        "CREATE TABLE txt (id int PRIMARY KEY, t text, d date, ts timestamp, tz timestamptz,"
        " iv interval, f8 float8, f4 real, m mood DEFAULT 'café');"
        "CREATE TABLE bin (LIKE txt INCLUDING ALL, note text DEFAULT 'ÿ é');"
        "INSERT INTO txt VALUES"
        " (1, 'café', '2024-01-02', '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05+00',"
        "  '-1 days +02:03:04', 0.1 + 0.2, 1 / 3.0, 'café'),"
        " (2, 'ÿ', '1999-12-31', '1999-12-31 23:59:59', '1999-12-31 23:59:59.5-08',"
        "  '1 year 2 mons -3 days 04:05:06.5', 1e300 / 7, 3.4e38, 'ok');"
        "INSERT INTO bin SELECT * FROM txt;"
        "CREATE TABLE big (id int PRIMARY KEY, v text);"
        "INSERT INTO big SELECT g, 'é' || g FROM generate_series(1, 300000) g;"
        "CREATE PUBLICATION pub FOR TABLE txt, bin, big;",
    )
    # The target: txt exists with one column of another type name (so its
    # copy is in text format); its database's defaults would kill long
    # statements, waits and idle transactions and make commits serializable.
    upgrade_target(pair.sub_dsn)
    _query(
        pair.sub_dsn,
        "CREATE TYPE mood AS ENUM ('ok', 'café');"
        "CREATE TABLE txt (id int PRIMARY KEY, t varchar, d date, ts timestamp, tz timestamptz,"
        " iv interval, f8 float8, f4 real, m mood);",
    )
    db = pair.sub_db
    settings = {
        "statement_timeout": "50ms",
        "lock_timeout": "10ms",
        "idle_in_transaction_session_timeout": "50ms",
        "default_transaction_isolation": "serializable",
    }
    if pair.sub.version >= 17:
        settings["transaction_timeout"] = "100ms"
    pair.sub_exec(";".join(f"ALTER DATABASE {db} SET {k} = '{v}'" for k, v in settings.items()))

    cfg = pair.config(source={"dsn": src_dsn})
    assert run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True) == 0

    for table in ("txt", "bin"):
        want = _portable(src_dsn, table)
        assert [r[1] for r in want] == ["café", "ÿ"]
        assert _portable(pair.sub_dsn, table) == want, table
    assert _query(pair.sub_dsn, "SELECT DISTINCT note FROM bin") == [("ÿ é",)]
    new = "INSERT INTO bin (id) VALUES (3) RETURNING note, m::text"  # the dumped defaults
    assert _query(pair.sub_dsn, new) == [("ÿ é", "café")]
    check = "SELECT count(*), sum(length(v)), max(v) FROM big"
    assert _query(pair.sub_dsn, check) == _query(src_dsn, check)


@ONE_PAIR
def test_table_without_replica_identity_is_copied_with_a_warning(
    pair: Pair, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pair.pub_exec(
        "CREATE TABLE logt (at int, msg text);"
        "INSERT INTO logt SELECT g, 'm' || g FROM generate_series(1, 100) g;"
        "CREATE PUBLICATION pub FOR TABLE logt;"
    )
    with caplog.at_level(logging.WARNING):
        assert run_bootstrap(pair.config(), recreate_slot=False, truncate=False, quiet=True) == 0
    assert pair.sub_exec("SELECT count(*) FROM logt") == [(100,)]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("public.logt" in m and "UPDATE" in m and "DELETE" in m for m in warned), warned
