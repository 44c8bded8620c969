"""The golden workload: every message kind pgoutput can produce, with the xids it used."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from applier.localpg import LocalCluster

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TYPE pt AS (x int, y int);
CREATE TABLE t_def (id int PRIMARY KEY, v text, big text);
ALTER TABLE t_def ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE t_idx (a int NOT NULL, b int NOT NULL, v text);
CREATE UNIQUE INDEX t_idx_ab ON t_idx (a, b);
ALTER TABLE t_idx REPLICA IDENTITY USING INDEX t_idx_ab;
CREATE TABLE t_full (id int, v text);
ALTER TABLE t_full REPLICA IDENTITY FULL;
CREATE TABLE t_nothing (id int, v text);
ALTER TABLE t_nothing REPLICA IDENTITY NOTHING;
CREATE TABLE t_parent (id serial PRIMARY KEY, v text);
CREATE TABLE t_child (id int PRIMARY KEY, parent int REFERENCES t_parent);
CREATE TABLE t_type (id int PRIMARY KEY, m mood, p pt);
CREATE TABLE t_big (id int PRIMARY KEY, pad text);
CREATE PUBLICATION pub FOR ALL TABLES;
"""

#: A value stored out of line (STORAGE EXTERNAL, > 2kB), so an update that leaves
#: it alone sends it as 'u' (unchanged TOAST).
BIG = "x" * 5000


@dataclass
class Workload:
    """The xids of the workload's transactions, by name."""

    xids: dict[str, int] = field(default_factory=dict)
    origin: str = ""


def _xact(conn: psycopg.Connection[Any], wl: Workload, name: str, *sql: str) -> None:
    with conn.transaction():
        wl.xids[name] = int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
        for s in sql:
            conn.execute(s.encode(), prepare=False)


def run_workload(cluster: LocalCluster, db: str, *, big_rows: int = 1500) -> Workload:
    wl = Workload(origin=f"o_{db}")
    with cluster.connect(db) as conn:
        _xact(conn, wl, "def", "INSERT INTO t_def VALUES (1, 'one', NULL), (2, 'two', NULL)",
              f"INSERT INTO t_def VALUES (3, 'toast', '{BIG}')",
              "UPDATE t_def SET v = 'uno' WHERE id = 1",
              "UPDATE t_def SET id = 20 WHERE id = 2",
              "UPDATE t_def SET v = 'still toast' WHERE id = 3",
              "DELETE FROM t_def WHERE id = 1")  # fmt: skip
        _xact(conn, wl, "idx", "INSERT INTO t_idx VALUES (1, 1, 'a')",
              "UPDATE t_idx SET b = 2 WHERE a = 1", "DELETE FROM t_idx WHERE a = 1")  # fmt: skip
        _xact(conn, wl, "full", "INSERT INTO t_full VALUES (1, 'f'), (2, NULL)",
              "UPDATE t_full SET v = 'g' WHERE id = 1",
              "DELETE FROM t_full WHERE id = 2")  # fmt: skip
        _xact(conn, wl, "nothing", "INSERT INTO t_nothing VALUES (7, 'n')")
        _xact(conn, wl, "type", "INSERT INTO t_type VALUES (1, 'happy', ROW(1, 2))")
        _xact(conn, wl, "parent", "INSERT INTO t_parent (v) VALUES ('p')",
              "INSERT INTO t_child VALUES (1, 1)")  # fmt: skip
        _xact(conn, wl, "truncate", "TRUNCATE t_parent RESTART IDENTITY CASCADE")
        _xact(conn, wl, "message", "SELECT pg_logical_emit_message(true, 'tx', 'in txn')",
              "INSERT INTO t_nothing VALUES (8, 'm')")  # fmt: skip
        conn.execute("SELECT pg_logical_emit_message(false, 'nontx', '\\xff00'::bytea)")
        _xact(conn, wl, "stream",
              f"INSERT INTO t_big SELECT i, repeat('s', 100) FROM generate_series(1, {big_rows}) i",
              "SAVEPOINT sp",
              f"INSERT INTO t_big SELECT i, repeat('a', 100) "
              f"FROM generate_series({big_rows + 1}, {3 * big_rows}) i",
              "ROLLBACK TO SAVEPOINT sp",
              "INSERT INTO t_big VALUES (0, 'after rollback')")  # fmt: skip
        for gid, finish in (("commit", "COMMIT PREPARED"), ("rollback", "ROLLBACK PREPARED")):
            full_gid = f"g_{gid}_{db}"
            conn.execute("BEGIN")
            wl.xids[f"2pc_{gid}"] = int(
                conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
            )
            conn.execute(f"INSERT INTO t_nothing VALUES (9, '{gid}')".encode(), prepare=False)
            conn.execute(f"PREPARE TRANSACTION '{full_gid}'".encode(), prepare=False)
            conn.execute(f"{finish} '{full_gid}'".encode(), prepare=False)
        conn.execute("SELECT pg_replication_origin_create(%s)", (wl.origin,))
        conn.execute("SELECT pg_replication_origin_session_setup(%s)", (wl.origin,))
        with conn.transaction():
            wl.xids["origin"] = int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
            conn.execute("SELECT pg_replication_origin_xact_setup('0/ABCDEF', now())")
            conn.execute("INSERT INTO t_nothing VALUES (10, 'from elsewhere')")
        conn.execute("SELECT pg_replication_origin_session_reset()")
    return wl


def drop_origin(cluster: LocalCluster, wl: Workload) -> None:
    cluster.execute(
        f"SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin "
        f"WHERE roname = '{wl.origin}'"
    )
