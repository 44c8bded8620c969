"""``applier status`` reports the slot, the origin and the lag from real servers."""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg
import pytest
from conftest import ONE_PAIR, SMOKE_PAIRS, Pair
from psycopg.rows import dict_row

from applier.schema import upgrade_target
from applier.status.report import SLOT_SQL


def _status(cfg_path: str) -> tuple[int, dict[str, object], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "status", "--config", cfg_path, "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout or "{}"), proc.stderr


@pytest.mark.parametrize("pair", SMOKE_PAIRS, indirect=True)
def test_status_reports_slot_origin_and_lag(pair: Pair) -> None:
    pair.pub_exec("CREATE TABLE t (id int primary key); CREATE PUBLICATION pub FOR TABLE t")
    pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput')")
    pair.pub_exec("INSERT INTO t SELECT generate_series(1, 1000)")
    upgrade_target(pair.sub_dsn)
    cfg = pair.write_config()
    origin = pair.slot  # the origin defaults to the slot name
    pair.sub_exec(f"SELECT pg_replication_origin_create('{origin}')")

    rc, st, err = _status(str(cfg))
    # No worker has run: health 4 (before applier health, status exited 0 here).
    assert rc == 4 and st["code"] == 4 and st["health"] == "not_running", err
    slot = st["slot"]
    assert isinstance(slot, dict)
    assert slot["active"] is False
    assert st["worker_holds_slot"] is False
    assert isinstance(st["lag_bytes"], int) and st["lag_bytes"] > 0
    progress = st["origin_progress"]
    assert isinstance(progress, dict) and progress["remote_lsn"] is None

    pair.sub_exec(f"SELECT pg_replication_origin_advance('{origin}', '0/1234ABC')")
    rc, st, err = _status(str(cfg))
    assert rc == 4, err
    progress = st["origin_progress"]
    assert isinstance(progress, dict) and progress["remote_lsn"] == "0/1234ABC"
    assert "password" not in json.dumps(st)


@ONE_PAIR
def test_status_names_the_side_that_is_down(pair: Pair) -> None:
    cfg = pair.write_config(target={"dsn": "host=127.0.0.1 port=1 dbname=x user=u password=s3cret"})
    rc, st, _ = _status(str(cfg))
    assert rc == 1
    errors = st["errors"]
    assert isinstance(errors, list)
    assert any("target unreachable" in e for e in errors)
    assert any("slot" in e and "does not exist" in e for e in errors)
    assert "s3cret" not in json.dumps(st)


def _command_in(st: dict[str, object]) -> bool:
    """The hint names the skip command."""
    return str(st["skip_command"]) in str(st["hint"])


def _text_status(cfg_path: str, code: int = 3) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "status", "--config", cfg_path],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr
    return proc.stdout


@ONE_PAIR
def test_status_counts_conflicts_and_prints_the_command_that_skips_the_failed_txn(
    pair: Pair,
) -> None:
    upgrade_target(pair.sub_dsn)
    # The slot exists, so that the health is the worker's error (3), not the slot (5).
    pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput')")
    cfg = pair.write_config()
    origin = pair.slot
    conflicts = [  # (origin, commit LSN, table, conflict, resolution)
        *[(origin, f"0/{n}00", "public", "t", "insert_exists", "skip") for n in (1, 2, 3)],
        (origin, "0/400", "public", "t", "update_missing", "skip"),
        *[(origin, f"0/{n}00", "s", "u", "insert_exists", "keep_local") for n in (5, 6)],
        ("another_origin", "0/700", "public", "t", "insert_exists", "skip"),
    ]
    with pair.sub_conn() as conn:
        for o, lsn, schema, table, conflict, resolution in conflicts:
            conn.execute(
                "INSERT INTO applier.conflict_log (origin, commit_lsn, change_no, schema_name, "
                "table_name, conflict, resolution, key) VALUES (%s, %s, 1, %s, %s, %s, %s, "
                """'{"id": "1"}')""",
                (o, lsn, schema, table, conflict, resolution),
            )
        for kind, extra in [("object", "'public.x', NULL"), ("error", "NULL, NULL")] * 2:
            conn.execute(
                "INSERT INTO applier.skip_rules (origin, kind, table_pattern, lsn, dump) "
                f"VALUES (%s, %s, {extra}, 'skipped')",
                (origin if kind == "object" else "another_origin", kind),
            )
        conn.execute(
            "INSERT INTO applier.skip_rules (origin, kind, lsn, dump, done) "
            "VALUES (%s, 'txn', '0/99', 'all', true)",
            (origin,),
        )
        error = {
            "kind": "ApplyError",
            "message": "duplicate key value violates unique constraint",
            "context": {"lsn": "0/1A2B300", "xid": "1234", "finish_lsn": "0/1A2B3C4"},
        }
        conn.execute(
            "INSERT INTO applier.worker_status (origin, slot, state, last_error, last_error_at) "
            "VALUES (%s, %s, 'error', %s::jsonb, now())",
            (origin, pair.slot, json.dumps(error)),
        )

    rc, st, err = _status(str(cfg))
    assert "Traceback" not in err
    assert rc == 3 and st["health"] == "error"
    assert "duplicate key value" in str(st["reason"]) and _command_in(st)
    got = st["conflicts"]
    assert isinstance(got, list)
    assert [(c["table"], c["conflict"], c["resolution"], c["count"]) for c in got] == [
        ("public.t", "insert_exists", "skip", 3),
        ("public.t", "update_missing", "skip", 1),
        ("s.u", "insert_exists", "keep_local", 2),
    ]
    assert all(c["last_at"] for c in got)
    assert st["active_skip_rules"] == 2  # this origin's, not done
    command = f"applier skip add --config {cfg} --lsn 0/1A2B3C4"
    assert st["skip_command"] == command
    assert st["skip_rule"] is None
    text = _text_status(str(cfg))
    assert f"  {command}\n" in text  # whole, on one line, to copy
    assert "insert_exists" in text and "keep_local" in text

    # The printed command works, and status then says the rule is there.
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", *command.split()[1:]],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rule = int(proc.stdout)
    _, st, _ = _status(str(cfg))
    assert st["skip_rule"] == rule and st["active_skip_rules"] == 3
    assert f"skip rule {rule} skips the transaction" in _text_status(str(cfg))

    # A worker that is running again (or an error without finish_lsn) gets no command.
    pair.sub_exec("UPDATE applier.worker_status SET state = 'running'")
    rc, st, _ = _status(str(cfg))
    assert st["skip_command"] is None
    assert rc == 4  # 'running' but no heartbeat since its error: not running
    pair.sub_exec(
        "UPDATE applier.worker_status SET state = 'error', "
        "last_error = last_error #- '{context,finish_lsn}'"
    )
    _, st, _ = _status(str(cfg))
    assert st["skip_command"] is None


#: pg_replication_slots and pg_stat_replication as PostgreSQL 10 and 11 have them (no
#: wal_status, safe_wal_size (13) nor reply_time (12)), laid over the real ones.
_PRE_12_CATALOG = """
CREATE SCHEMA pg11;
CREATE VIEW pg11.pg_replication_slots AS
  SELECT slot_name, plugin, slot_type, datoid, database, temporary, active, active_pid,
         xmin, catalog_xmin, restart_lsn, confirmed_flush_lsn
  FROM pg_catalog.pg_replication_slots;
CREATE VIEW pg11.pg_stat_replication AS
  SELECT pid, usesysid, usename, application_name, client_addr, client_hostname,
         client_port, backend_start, backend_xmin, state, sent_lsn, write_lsn, flush_lsn,
         replay_lsn, write_lag, flush_lag, replay_lag, sync_priority, sync_state
  FROM pg_catalog.pg_stat_replication;
"""


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # the catalog is emulated
def test_status_on_a_source_without_wal_status(pair: Pair) -> None:
    """Sources 10 to 12 have no wal_status and safe_wal_size (10, 11 no reply_time):
    status's slot query reads them as unknown instead of failing.

    applier pins ``search_path`` to pg_catalog on every connection (applier.pgconn),
    so the old-shaped views are put first on a plain session's path here, and the
    query status sends is run on it."""
    pair.pub_exec("CREATE TABLE t (id int primary key); CREATE PUBLICATION pub FOR TABLE t")
    pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput')")
    pair.pub_exec(_PRE_12_CATALOG)
    with psycopg.connect(pair.pub_dsn, autocommit=True) as conn:
        conn.execute("SET search_path = pg11, pg_catalog")
        assert conn.execute(
            "SELECT to_jsonb(s) ? 'wal_status' FROM pg_replication_slots s LIMIT 1"
        ).fetchone() == (False,)  # the emulation holds
        slot = conn.cursor(row_factory=dict_row).execute(SLOT_SQL, (pair.slot,)).fetchone()
    assert slot is not None
    assert slot["wal_status"] is None and slot["safe_wal_size"] is None
    assert slot["reply_time"] is None and slot["failover"] is None
    assert slot["confirmed_flush_lsn"] is not None and slot["retained_bytes"] is not None
