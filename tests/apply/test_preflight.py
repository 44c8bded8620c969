"""Checks before streaming (applier/apply/target/preflight.py), through the real CLI and servers.

A missing slot is never recreated for an origin with progress (exit 3), a
slot of the wrong kind or database is refused, a different source is
refused, `run` refuses while a bootstrap of its slot is unfinished, and the
bootstrap's hand-off refuses a slot that moved past its consistent point.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from applykit import ROOT, Runner, origin_lsn, wait_equal, wait_for
from conftest import ONE_PAIR, Pair

from applier.errors import EXIT_PERMANENT


def _replicated(pair: Pair, **sections: dict[str, object]) -> Path:
    """Run once so the origin has progress; return the config used."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    cfg = pair.write_config(**sections)
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 50) g")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    return cfg


def _exits(pair: Pair, cfg: Path, name: str) -> tuple[int, str]:
    """Start `applier run`; it must exit by itself within 30 s. Returns (code, log)."""
    runner = Runner(pair, cfg, log_name=name).start()
    try:
        rc = runner.wait(30)
    except subprocess.TimeoutExpired:
        runner.kill()
        raise AssertionError(f"applier run kept running:\n{runner.log()[-3000:]}") from None
    return rc, runner.log()


def _slots(pair: Pair) -> list[tuple[object, ...]]:
    return pair.pub.execute(
        f"SELECT slot_name FROM pg_replication_slots WHERE slot_name = '{pair.slot}'"
    )


def _drop_slot(pair: Pair, name: str) -> None:
    pair.pub.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
        f"WHERE slot_name = '{name}'"
    )


@ONE_PAIR
def test_missing_slot_with_progress_is_not_recreated(pair: Pair) -> None:
    cfg = _replicated(pair)
    progress = origin_lsn(pair, pair.slot)
    assert progress not in (None, "0/0")
    pair.pub_exec(f"SELECT pg_drop_replication_slot('{pair.slot}')")
    pair.pub_exec("INSERT INTO t VALUES (1000, 'lost if the slot were recreated')")

    rc, log = _exits(pair, cfg, "missing.log")
    assert rc == EXIT_PERMANENT, log
    assert f"replication slot {pair.slot!r} does not exist" in log
    assert f"origin {pair.slot!r}" in log and progress in log
    assert "applier bootstrap --recreate-slot" in log
    assert "Traceback" not in log
    assert _slots(pair) == []  # not recreated
    assert origin_lsn(pair, pair.slot) == progress
    status = pair.sub_exec("SELECT state, last_error->>'kind' FROM applier.worker_status")
    assert status == [("error", "SlotMissing")]


@ONE_PAIR
def test_slot_of_another_kind_is_refused(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    pair.pub_exec(f"SELECT pg_create_physical_replication_slot('{pair.slot}')")
    rc, log = _exits(pair, pair.write_config(), "physical.log")
    assert rc == EXIT_PERMANENT, log
    assert "is a physical slot" in log and "Traceback" not in log


@ONE_PAIR
def test_slot_of_another_database_is_refused(pair: Pair) -> None:
    other = f"{pair.pub_db}_x"
    pair.pub.create_database(other)
    pair.cleanup.append(lambda: pair.pub.drop_database(other))
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    pair.pub.execute(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput')", other)
    pair.cleanup.append(lambda: _drop_slot(pair, pair.slot))  # runs before the DROP DATABASE
    rc, log = _exits(pair, pair.write_config(), "otherdb.log")
    assert rc == EXIT_PERMANENT, log
    assert f"belongs to database {other!r}" in log and "Traceback" not in log


@ONE_PAIR
def test_a_different_source_is_refused(pair: Pair) -> None:
    cfg = _replicated(pair)
    ident = pair.sub_exec("SELECT system_identifier, timeline, dbname FROM applier.source_identity")
    assert len(ident) == 1 and ident[0][2] == pair.pub_db

    # Same origin, another database of the same cluster (its own slot): refused.
    other = f"{pair.pub_db}_y"
    pair.pub.create_database(other)
    pair.cleanup.append(lambda: pair.pub.drop_database(other))
    pair.pub.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t", other
    )
    pair.cleanup.append(lambda: _drop_slot(pair, f"{pair.slot}_y"))
    dsn = pair.pub.dsn(other)
    moved = pair.write_config(
        source={"dsn": dsn, "slot": f"{pair.slot}_y"}, target={"origin": pair.slot}
    )
    rc, log = _exits(pair, moved, "otherdb.log")
    assert rc == EXIT_PERMANENT, log
    assert f"the source is not the one origin {pair.slot!r} replicates from" in log
    assert other in log and pair.pub_db in log
    assert not pair.pub.execute(
        f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{pair.slot}_y'"
    )  # no slot made on the wrong source

    # Another system (a different system identifier recorded): refused as well.
    pair.sub_exec("UPDATE applier.source_identity SET system_identifier = '1'")
    rc, log = _exits(pair, cfg, "othersys.log")
    assert rc == EXIT_PERMANENT, log
    assert "system identifier" in log and "Traceback" not in log


@ONE_PAIR
def test_run_refuses_while_a_bootstrap_is_unfinished(pair: Pair) -> None:
    from applier.schema import upgrade_target

    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    upgrade_target(pair.sub_dsn)
    pair.sub_exec(
        f"INSERT INTO applier.bootstrap_run (slot, run_id, phase) VALUES ('{pair.slot}', 1, 'copy')"
    )
    rc, log = _exits(pair, pair.write_config(), "unfinished.log")
    assert rc == EXIT_PERMANENT, log
    assert "bootstrap" in log and "finish it with `applier bootstrap`" in log
    assert _slots(pair) == []  # nothing created on the source either
    pair.sub_exec("UPDATE applier.bootstrap_run SET phase = 'done'")
    runner = Runner(pair, pair.write_config()).start().ready()
    assert runner.stop() == 0


@ONE_PAIR
def test_handoff_refuses_a_slot_moved_past_the_consistent_point(pair: Pair) -> None:
    from applier.bootstrap.job import PriorRun, finish
    from applier.bootstrap.sequences import connect
    from applier.errors import PermanentError
    from applier.schema import upgrade_target
    from applier.stream.replconn import ReplicationConnection

    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    upgrade_target(pair.sub_dsn)
    with ReplicationConnection.open(pair.pub_dsn) as repl:
        consistent = repl.create_slot(pair.slot).consistent_point
    pair.sub_exec(
        "INSERT INTO applier.bootstrap_run (slot, run_id, phase, consistent_lsn) "
        f"VALUES ('{pair.slot}', 1, 'post_data', '{consistent}')"
    )
    # Another consumer confirms changes past the consistent point.
    pair.pub_exec("INSERT INTO t SELECT generate_series(1, 10)")
    pair.pub_exec(f"SELECT pg_replication_slot_advance('{pair.slot}', pg_current_wal_lsn())")
    cfg = pair.config()
    run = PriorRun(1, "post_data", str(consistent), None, [])
    with connect(pair.sub_dsn, "target") as tgt, pytest.raises(PermanentError) as err:
        finish(cfg, tgt, run)
    assert "moved past" in str(err.value) and str(consistent) in str(err.value)
    assert origin_lsn(pair, pair.slot) is None  # the origin was not set
    phase = pair.sub_exec("SELECT phase FROM applier.bootstrap_run")
    assert phase == [("post_data",)]


def test_help_and_unit_document_exit_codes() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "applier.cli", "--help"], capture_output=True, text=True, cwd=ROOT
    ).stdout
    run_help = subprocess.run(
        [sys.executable, "-m", "applier.cli", "run", "--help"],
        capture_output=True, text=True, cwd=ROOT,
    ).stdout  # fmt: skip
    for text in (out, run_help):
        for code in ("0", "1", "2", "3"):
            assert f"{code}  " in text or f"{code} " in text
        assert "Exit codes" in text
    unit = (ROOT / "conf" / "applier.service").read_text()
    assert "RestartPreventExitStatus=2 3" in unit


@pytest.mark.slow
# Both pairs have the same PG15 source, and the identity row is the applier schema's SQL
# on the target (a Spark bootstrap to each target version runs in tests/bootstrap).
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_bootstrap_records_the_source_and_run_accepts_it(pair: Pair) -> None:
    pair.pub_exec(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 100) g;"
        "CREATE PUBLICATION pub FOR TABLE t"
    )
    cfg = pair.write_config(bootstrap={"spark_master": "local[1]"})
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "bootstrap", "--config", str(cfg), "--quiet"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    sysid = pair.pub_exec("SELECT system_identifier::text FROM pg_control_system()")[0][0]
    ident = pair.sub_exec("SELECT system_identifier, dbname, slot FROM applier.source_identity")
    assert ident == [(sysid, pair.pub_db, pair.slot)]
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (101, 'b')")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0


@pytest.mark.slow
def test_timeline_change_of_the_same_source(make_pair: Callable[..., Pair]) -> None:
    """A promotion (new timeline, same system) is accepted if it branched after the progress."""
    pair = make_pair(15, 15)
    cfg = _replicated(pair)
    assert pair.sub_exec("SELECT timeline FROM applier.source_identity") == [(1,)]
    # Archive recovery that finds no archive promotes at the end of the local WAL:
    # timeline 2, same system identifier, the slot still there.
    pair.pub.stop()
    with open(pair.pub.datadir / "postgresql.auto.conf", "a") as f:
        f.write("restore_command = 'false'\n")
    (pair.pub.datadir / "recovery.signal").touch()
    pair.pub.start()
    wait_for(lambda: not pair.pub.execute("SELECT pg_is_in_recovery()")[0][0], 30, "promotion")
    pair.pub_exec("INSERT INTO t VALUES (1000, 'after the promotion')")

    runner = Runner(pair, cfg, log_name="promoted.log").start().ready()
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    assert "the source changed timeline" in runner.log()
    assert pair.sub_exec("SELECT timeline FROM applier.source_identity") == [(2,)]

    # A timeline the recorded one is not an ancestor of: refused.
    pair.sub_exec("UPDATE applier.source_identity SET timeline = 5")
    rc, log = _exits(pair, cfg, "lower.log")
    assert rc == EXIT_PERMANENT and "does not descend from timeline 5" in log, log
    # The origin past the point where the new timeline branched off: refused.
    pair.sub_exec("UPDATE applier.source_identity SET timeline = 1")
    pair.sub_exec(f"SELECT pg_replication_origin_advance('{pair.slot}', 'FF/0')")
    rc, log = _exits(pair, cfg, "forked.log")
    assert rc == EXIT_PERMANENT and "branched off timeline 1" in log, log


# Refused before the applier schema exists; granted, the role creates it.
@pytest.mark.bare_target
def test_run_names_a_missing_origin_function_grant(pair: Pair) -> None:
    """A target role lacking EXECUTE on one origin function: `run` exits 3 in one line
    giving the GRANT, before it creates the applier schema or the slot; granted, it runs."""
    from bootstrap.test_privileges import add_role, grants_for

    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    role = add_role(
        pair,
        "sub",
        "CREATE ROLE {r} LOGIN; GRANT CREATE ON DATABASE {db} TO {r}; GRANT ALL ON t TO {r};"
        "GRANT EXECUTE ON FUNCTION pg_replication_origin_create(text),"
        " pg_replication_origin_xact_setup(pg_lsn, timestamptz),"
        " pg_replication_origin_xact_reset(), pg_replication_origin_advance(text, pg_lsn),"
        " pg_replication_origin_progress(text, boolean),"
        " pg_replication_origin_session_progress(boolean), pg_replication_origin_session_reset()"
        " TO {r}; GRANT SET ON PARAMETER session_replication_role TO {r};",
    )
    cfg = pair.write_config(target={"dsn": pair.sub.dsn(pair.sub_db, user=role)})
    rc, log = _exits(pair, cfg, "grant.log")
    assert rc == EXIT_PERMANENT, log
    assert "Traceback" not in log
    lines = [ln for ln in log.splitlines() if "GRANT" in ln]
    assert len(lines) == 1, log
    grant = "GRANT EXECUTE ON FUNCTION pg_catalog.pg_replication_origin_session_setup(text)"
    assert f'{grant} TO "{role}";' in lines[0], lines[0]
    assert _slots(pair) == []
    assert pair.sub_exec("SELECT nspname FROM pg_namespace WHERE nspname = 'applier'") == []

    pair.sub_exec(grants_for(lines[0], "target"))
    runner = Runner(pair, cfg, log_name="granted.log").start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1, 'a')")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
