"""``applier status`` reports the slot, the origin and the lag from real servers."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import Pair

from applier.schema import upgrade_target


def _status(cfg_path: str) -> tuple[int, dict[str, object], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "status", "--config", cfg_path, "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout or "{}"), proc.stderr


def test_status_reports_slot_origin_and_lag(pair: Pair) -> None:
    pair.pub_exec("CREATE TABLE t (id int primary key); CREATE PUBLICATION pub FOR TABLE t")
    pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput')")
    pair.pub_exec("INSERT INTO t SELECT generate_series(1, 1000)")
    upgrade_target(pair.sub_dsn)
    cfg = pair.write_config()
    origin = pair.slot  # the origin defaults to the slot name
    pair.sub_exec(f"SELECT pg_replication_origin_create('{origin}')")

    rc, st, err = _status(str(cfg))
    assert rc == 0, err
    slot = st["slot"]
    assert isinstance(slot, dict)
    assert slot["active"] is False
    assert st["worker_holds_slot"] is False
    assert isinstance(st["lag_bytes"], int) and st["lag_bytes"] > 0
    progress = st["origin_progress"]
    assert isinstance(progress, dict) and progress["remote_lsn"] is None

    pair.sub_exec(f"SELECT pg_replication_origin_advance('{origin}', '0/1234ABC')")
    rc, st, err = _status(str(cfg))
    assert rc == 0, err
    progress = st["origin_progress"]
    assert isinstance(progress, dict) and progress["remote_lsn"] == "0/1234ABC"
    assert "password" not in json.dumps(st)


def test_status_names_the_side_that_is_down(pair: Pair) -> None:
    cfg = pair.write_config(target={"dsn": "host=127.0.0.1 port=1 dbname=x user=u password=s3cret"})
    rc, st, _ = _status(str(cfg))
    assert rc == 1
    errors = st["errors"]
    assert isinstance(errors, list)
    assert any("target unreachable" in e for e in errors)
    assert any("slot" in e and "does not exist" in e for e in errors)
    assert "s3cret" not in json.dumps(st)
