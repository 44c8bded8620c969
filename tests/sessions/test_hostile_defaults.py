"""Every command against databases whose defaults are hostile (issue 31, item 1).

``ALTER DATABASE ... SET`` reaches every new session: a ``DateStyle`` applier's
driver cannot parse, an interval or float format that loses exactness, a
1 ms ``statement_timeout``, a read-only source, and a ``search_path`` whose
first schema, writable by a role that owns nothing of ours, plants functions
and operators named like the ones applier calls (with applier's privileges,
they would run as a superuser here). Every connection applier opens pins its
session (:mod:`applier.pgconn`): each command must succeed, with exact
results, and nothing planted may run.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Pair

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apply"))
from applykit import ROOT, Runner, wait_for

# Every command, `migrate` and the first run's migrations included, on a target
# whose defaults were hostile before applier ever connected.
pytestmark = pytest.mark.bare_target

#: Sane settings for the test's own sessions (applier's are what is under test).
CALM = (
    "-c statement_timeout=0 -c default_transaction_read_only=off -c datestyle=ISO "
    "-c intervalstyle=postgres -c timezone=UTC -c extra_float_digits=3 -c search_path=public"
)

HOSTILE = {
    "DateStyle": "SQL, MDY",
    "IntervalStyle": "postgres_verbose",
    "TimeZone": "Pacific/Chatham",
    "extra_float_digits": "-15",
    "statement_timeout": "1ms",
    # A list, unquoted: quoted, it would name one schema "evil, pg_catalog, public".
    "search_path": "evil, pg_catalog, public",
}

#: Functions named like catalog functions applier calls, and operators it uses:
#: each records that it ran in evil.ran, then does what the real one does.
PLANTED_FUNCTIONS = [
    ("now()", "timestamptz", "pg_catalog.now()"),
    ("set_config(text, text, boolean)", "text", "pg_catalog.set_config($1, $2, $3)"),
    ("current_setting(text)", "text", "pg_catalog.current_setting($1)"),
    ("to_regclass(text)", "regclass", "pg_catalog.to_regclass($1)"),
    ("to_regtype(text)", "regtype", "pg_catalog.to_regtype($1)"),
    ("format(text)", "text", "pg_catalog.format($1)"),
    ("pg_backend_pid()", "int4", "pg_catalog.pg_backend_pid()"),
    ("pg_current_wal_lsn()", "pg_lsn", "pg_catalog.pg_current_wal_lsn()"),
    (
        "pg_replication_origin_session_setup(text)",
        "void",
        "pg_catalog.pg_replication_origin_session_setup($1)",
    ),
    ("pg_replication_origin_oid(text)", "oid", "pg_catalog.pg_replication_origin_oid($1)"),
    (
        "pg_replication_origin_progress(text, boolean)",
        "pg_lsn",
        "pg_catalog.pg_replication_origin_progress($1, $2)",
    ),
    ("hashtext(text)", "int4", "pg_catalog.hashtext($1)"),
    ("pg_try_advisory_lock(int4, int4)", "boolean", "pg_catalog.pg_try_advisory_lock($1, $2)"),
    ("pg_advisory_xact_lock(int4)", "void", "pg_catalog.pg_advisory_xact_lock($1)"),
    ("string_agg(text, text)", None, None),  # an aggregate, below
]
PLANTED_OPERATORS = ["int4", "int8", "text", "name", "oid", "pg_lsn"]


def _plant_sql() -> str:
    out = [
        "CREATE TABLE evil.ran (what text, at timestamptz DEFAULT pg_catalog.clock_timestamp())",
        "GRANT INSERT ON evil.ran TO PUBLIC",
        "SET ROLE mallory",
    ]
    for sig, ret, body in PLANTED_FUNCTIONS:
        if ret is None or body is None:
            continue
        name = sig.split("(")[0]
        call = f"PERFORM {body}" if ret == "void" else f"RETURN {body}"
        out.append(
            f"CREATE FUNCTION evil.{sig} RETURNS {ret} LANGUAGE plpgsql AS $f$ BEGIN "
            f"INSERT INTO evil.ran (what) VALUES ('{name}'); {call}; END $f$"
        )
    out.append(
        "CREATE FUNCTION evil.agg(text, text, text) RETURNS text LANGUAGE plpgsql AS $f$ BEGIN "
        "INSERT INTO evil.ran (what) VALUES ('string_agg'); "
        "RETURN pg_catalog.concat_ws($3, $1, $2); END $f$"
    )
    out.append("CREATE AGGREGATE evil.string_agg(text, text) (sfunc = evil.agg, stype = text)")
    out.append(
        "CREATE FUNCTION evil.cnt(int8) RETURNS int8 LANGUAGE plpgsql AS $f$ BEGIN "
        "INSERT INTO evil.ran (what) VALUES ('count'); RETURN $1 + 1; END $f$"
    )
    out.append("CREATE AGGREGATE evil.count(*) (sfunc = evil.cnt, stype = int8, initcond = '0')")
    for typ in PLANTED_OPERATORS:
        out.append(
            f"CREATE FUNCTION evil.eq_{typ}({typ}, {typ}) RETURNS boolean LANGUAGE plpgsql "
            f"AS $f$ BEGIN INSERT INTO evil.ran (what) VALUES ('= {typ}'); "
            f"RETURN $1 OPERATOR(pg_catalog.=) $2; END $f$"
        )
        out.append(
            f"CREATE OPERATOR evil.= (leftarg = {typ}, rightarg = {typ}, function = evil.eq_{typ})"
        )
    out.append("RESET ROLE")
    return ";\n".join(out)


def calm(pair: Pair, side: str) -> psycopg.Connection[Any]:
    dsn = pair.pub_dsn if side == "source" else pair.sub_dsn
    return psycopg.connect(dsn, autocommit=True, options=CALM)


def query(pair: Pair, side: str, sql: str) -> list[tuple[Any, ...]]:
    with calm(pair, side) as conn:
        cur = conn.execute(sql.encode(), prepare=False)
        return cur.fetchall() if cur.description else []


def make_hostile(pair: Pair) -> None:
    """Plant evil on both sides, then set the hostile defaults on both databases."""
    for side, db in (("source", pair.pub_db), ("target", pair.sub_db)):
        query(
            pair, side,
            "DO $$ BEGIN CREATE ROLE mallory NOLOGIN; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$; "
            "CREATE SCHEMA evil AUTHORIZATION mallory; " + _plant_sql(),
        )  # fmt: skip
        settings = dict(HOSTILE)
        if side == "source":
            settings["default_transaction_read_only"] = "on"
        for name, value in settings.items():
            value = value if name == "search_path" else f"'{value}'"
            query(pair, side, f'ALTER DATABASE "{db}" SET {name} = {value}')


def planted_runs(pair: Pair) -> list[tuple[Any, ...]]:
    return [
        (side, *row)
        for side in ("source", "target")
        for row in query(pair, side, "SELECT what FROM evil.ran ORDER BY at")
    ]


def rows(pair: Pair, side: str, table: str) -> list[tuple[Any, ...]]:
    """Every row as text under calm settings: exact values, compared across sides."""
    return query(pair, side, f"SELECT t::text FROM {table} t ORDER BY 1")


def applier(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return proc


@pytest.fixture
def hostile(pair: Pair) -> Iterator[Pair]:
    tables = (
        "CREATE TABLE public.t (id int PRIMARY KEY, ts timestamptz, d date, iv interval, "
        "f8 float8, f4 float4, n numeric, v text)"
    )
    query(pair, "source", tables + "; CREATE PUBLICATION pub FOR ALL TABLES")
    query(pair, "target", tables)
    make_hostile(pair)
    yield pair
    for side, db in (("source", pair.pub_db), ("target", pair.sub_db)):
        query(pair, side, f'ALTER DATABASE "{db}" RESET ALL')


WRITES = [
    "INSERT INTO t VALUES (1, '2024-03-05 06:07:08.123456+00', '2024-12-31', "
    "'1 year 2 mons 3 days 04:05:06.5', 0.1, 0.1, 1.5, 'a'), "
    "(2, '1999-01-08 23:59:59.999999-08', '1999-01-08', '-1 days +02:03:04', "
    "3.141592653589793, 1e-7, -0.000001, 'b'), "
    "(3, 'infinity', '-infinity', '00:00:00', 'NaN', '-Infinity', 'NaN', 'c')",
    "UPDATE t SET ts = ts + interval '1 hour 2 minutes', iv = iv * 2, f8 = f8 / 3 WHERE id = 1",
    "DELETE FROM t WHERE id = 2",
    "INSERT INTO t VALUES (4, '2024-06-30 23:59:60+05:30', '2000-02-29', '6 mons -1 days', "
    "1.0000000000000002, 16777216, 0.30000000000000004, 'd')",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_same(pair: Pair, runner: Runner | None = None) -> None:
    def same() -> bool:
        if runner is not None and not runner.alive():
            raise AssertionError(f"applier exited:\n{runner.log()[-4000:]}")
        return rows(pair, "source", "public.t") == rows(pair, "target", "public.t")

    wait_for(same, 60, "the target to match the source")


# Both versions on each side, the source's walsender included.
@pytest.mark.parametrize("pair", ["15-15", "18-18"], indirect=True)
def test_every_command_against_hostile_defaults(hostile: Pair) -> None:
    pair = hostile
    port = free_port()
    cfg = pair.write_config(metrics={"listen": f"127.0.0.1:{port}"})
    # The bait is live: a session on the database's defaults runs what was planted.
    with psycopg.connect(pair.sub_dsn, autocommit=True) as conn:
        conn.execute("SET statement_timeout = 0")
        conn.execute("SELECT to_regclass('x'), now(), 1 = 1, 'a'::text = 'b', count(*)")
    assert {r[1] for r in planted_runs(pair)} >= {"to_regclass", "now", "= int4", "= text"}
    query(pair, "target", "TRUNCATE evil.ran")

    proc = applier("migrate", "--config", cfg)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert query(pair, "target", "SELECT count(*) FROM applier.alembic_version") == [(1,)]

    runner = Runner(pair, cfg).start().ready()
    for stmt in WRITES:
        query(pair, "source", stmt)
    wait_same(pair, runner)
    expected = rows(pair, "source", "public.t")
    assert len(expected) == 3 and "2024-03-05 07:09:08.123456+00" in expected[0][0], expected

    # The scrape reads the slot's retained WAL on a source connection of its own.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        scraped = r.read().decode()
    assert re.search(r"^applier_slot_retained_wal_bytes \d", scraped, re.M), scraped

    proc = applier("status", "--config", cfg, "--json")
    st = json.loads(proc.stdout or "{}")
    assert proc.returncode == 0 and st["health"] == "healthy", (st, proc.stderr[-4000:])
    assert st["worker"]["state"] == "running" and st["worker_holds_slot"] is True, st
    proc = applier("status", "--config", cfg)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    proc = applier("skip", "add", "--config", cfg, "--table", "public.nothing_*")
    assert proc.returncode == 0 and proc.stdout.strip().isdigit(), proc.stderr[-4000:]
    proc = applier("skip", "list", "--config", cfg, "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    listed = json.loads(proc.stdout)
    assert [r["table"] for r in listed] == ["public.nothing_*"], listed
    # Its time as the target has it, exactly (a UTC offset, not Pacific/Chatham's text).
    created = query(pair, "target", "SELECT created_at FROM applier.skip_rules")[0][0]
    assert listed[0]["created_at"] == created.isoformat(), listed

    assert runner.stop() == 0, runner.log()[-4000:]

    # Not applied yet: cutover applies it in-process, then decode shows the stream.
    query(pair, "source", WRITES[1].replace("id = 1", "id = 4"))
    proc = applier("cutover", "--config", cfg, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert json.loads(proc.stdout)["caught_up"] is True
    wait_same(pair)

    slot = query(pair, "source", "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                 f"WHERE slot_name = '{pair.slot}'")[0][0]  # fmt: skip
    query(pair, "source", "UPDATE t SET ts = '2024-01-02 03:04:05.5+00', "
          "iv = '1 day 00:00:01.25', f8 = 0.1 WHERE id = 1")  # fmt: skip
    end = query(pair, "source", "SELECT pg_current_wal_lsn()::text")[0][0]
    proc = applier("decode", "--config", cfg, "--format", "json", "--end", end)
    assert proc.returncode == 0, proc.stderr[-4000:]
    updates = [json.loads(ln) for ln in proc.stdout.splitlines() if '"update"' in ln]
    assert updates, proc.stdout
    text = json.dumps(updates[-1])
    assert "2024-01-02 03:04:05.5+00" in text and "1 day 00:00:01.25" in text, text
    assert "0.1" in text, text
    now = query(pair, "source", "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                f"WHERE slot_name = '{pair.slot}'")[0][0]  # fmt: skip
    assert now == slot  # decode never advances the slot

    proc = applier("drop", "--config", cfg, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert (
        query(pair, "source", f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{pair.slot}'")
        == []
    )
    assert query(pair, "target", "SELECT pg_catalog.to_regnamespace('applier')") == [(None,)]

    assert planted_runs(pair) == []


@pytest.mark.spark
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_bootstrap_verify_and_sync_tables_against_hostile_defaults(pair: Pair) -> None:
    """The Spark-backed commands, in sequence on one pair: the target lacks the
    tables (pg_dump's children, an enum made from the source's, an extension's type
    created in its schema, not in the pinned search_path's pg_catalog), verify compares
    every row's text, sync-tables copies a table added later."""
    query(
        pair, "source",
        "CREATE EXTENSION citext SCHEMA public; "
        "CREATE TYPE public.mood AS ENUM ('sad', 'ok'); "
        "CREATE TABLE public.t (id int PRIMARY KEY, ts timestamptz, d date, iv interval, "
        "f8 float8, f4 float4, n numeric, v text, m public.mood, c public.citext); "
        "INSERT INTO public.t SELECT g, '2024-03-05 06:07:08.123456+00'::timestamptz "
        "+ g * interval '1 day 1.5 s', date '2000-02-29' + g, g * interval '1 mon -1 day 0.25 s', "
        "1.0 / g, 1.0 / g, g / 7.0, 'v' || g, 'ok', 'MiXed' || g FROM generate_series(1, 3000) g; "
        "CREATE TABLE public.later (id int PRIMARY KEY, ts timestamptz, iv interval, f8 float8); "
        "INSERT INTO public.later SELECT g, 'epoch'::timestamptz + g * interval '1.001 s', "
        "g * interval '-1 mon 1 s', 1.0 / g FROM generate_series(1, 2000) g; "
        "CREATE PUBLICATION pub FOR TABLE public.t",
    )  # fmt: skip
    make_hostile(pair)
    try:
        cfg = pair.write_config(bootstrap={"spark_master": "local[2]"})
        proc = applier("bootstrap", "--config", cfg, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        assert rows(pair, "target", "public.t") == rows(pair, "source", "public.t")

        proc = applier("verify", "--config", cfg, "--json", timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

        runner = Runner(pair, cfg).start().ready()
        query(pair, "source", "UPDATE t SET ts = ts + interval '1.5 s', f8 = f8 / 3 WHERE id < 10")
        wait_same(pair, runner)
        query(pair, "source", "ALTER PUBLICATION pub ADD TABLE public.later")
        # Its first change makes the worker say the table needs sync-tables.
        query(pair, "source", "INSERT INTO later VALUES (0, 'infinity', '-1 year', 'NaN')")
        wait_for(lambda: "run `applier sync-tables" in runner.log(), 30, "the worker's warning")
        proc = applier("sync-tables", "--config", cfg, "--quiet", timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        query(pair, "source", "UPDATE later SET f8 = f8 * 3, iv = -iv WHERE id < 10")
        wait_for(
            lambda: rows(pair, "target", "public.later") == rows(pair, "source", "public.later"),
            60, "the added table to match",
        )  # fmt: skip
        assert runner.stop() == 0, runner.log()[-4000:]
        proc = applier("verify", "--config", cfg, "--json", timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    finally:
        for side, db in (("source", pair.pub_db), ("target", pair.sub_db)):
            query(pair, side, f'ALTER DATABASE "{db}" RESET ALL')
    assert planted_runs(pair) == []
