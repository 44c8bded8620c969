"""Refusals a restart cannot cure end a command with exit 2 or 3 and one line, never 1.

Issue 31, item 8: a wrong password, a missing database or role, a misspelled
publication, non-empty target tables and a pg_dump older than the source all
exited 1 ("transient"), so systemd restarted the worker forever, and `run`
with a misspelled publication logged "replication started" and failed only
at the first change. Each is run here through the real CLI on real servers:
the exit code, one error line (no traceback), and nothing created (no slot).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ClusterPool, Pair

from applier.errors import EXIT_PERMANENT, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]

#: Commands that open both servers at once (bootstrap and verify before any JVM starts).
COMMANDS = ["run", "status", "verify", "bootstrap", "sync-sequences", "drop"]


def _cli(command: str, cfg: Path, timeout: float = 30) -> tuple[int, str]:
    """Run ``applier COMMAND --config cfg``; it must exit by itself. Returns (code, stderr)."""
    extra = {"bootstrap": ["--quiet"], "drop": ["--yes"]}.get(command, [])
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", command, "--config", str(cfg), *extra],
        capture_output=True, text=True, cwd=ROOT, timeout=timeout,
    )  # fmt: skip
    return proc.returncode, proc.stderr


def _one_error_line(err: str) -> str:
    """The single error line of a failed command (its other lines are INFO logs)."""
    tail = "\n".join(err.splitlines()[-8:])
    assert "Traceback" not in err, tail
    errors = [line for line in err.splitlines() if " applier: error: " in line]
    assert len(errors) == 1, tail
    return errors[0]


def _config(pair: Pair, level: str = "warning", **sections: dict[str, object]) -> Path:
    """The pair's config at a log level that keeps stderr to the lines a user reads."""
    return pair.write_config(logging={"level": level}, **sections)


def _slots(pair: Pair) -> list[tuple[object, ...]]:
    return pair.pub_exec(
        "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()"
    )


def _table(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")


def _each_command(cfg: Path) -> dict[str, tuple[int, str]]:
    """Every command of COMMANDS on one config, two at a time: (code, stderr) by command.

    Nothing they do to the servers can meet (each is refused at its first
    connection), and a run is mostly Python's start-up: a second core halves it."""
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(COMMANDS, pool.map(lambda c: _cli(c, cfg), COMMANDS), strict=True))


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
@pytest.mark.parametrize("side", ["source", "target"])
@pytest.mark.parametrize("what", ["database", "role"])
def test_missing_database_or_role_is_exit_2(pair: Pair, side: str, what: str) -> None:
    """Each command in turn on one pair (a pair per command cost more than the command)."""
    _table(pair)
    cluster = pair.pub if side == "source" else pair.sub
    db = pair.pub_db if side == "source" else pair.sub_db
    dsn = cluster.dsn("nosuchdb") if what == "database" else cluster.dsn(db, user="nosuchrole")
    cfg = _config(pair, **{side: {"dsn": dsn}})
    for command, (rc, err) in _each_command(cfg).items():
        assert rc == EXIT_USAGE, (command, err[-3000:])
        line = _one_error_line(err)
        assert f"the {side} refused the connection" in line, (command, line)
        missing = 'database "nosuchdb" does not exist' if what == "database" else "nosuchrole"
        assert missing in line and "hint:" in line and f"[{side}]" in line, (command, line)
    assert _slots(pair) == []


def test_wrong_password_is_exit_2(make_pair: Callable[..., Pair]) -> None:
    hba = ["host all pwuser 127.0.0.1/32 scram-sha-256"]
    hba_repl = ["host replication pwuser 127.0.0.1/32 scram-sha-256"]
    pair = make_pair(15, 15, pub_hba=hba + hba_repl, sub_hba=hba)
    _table(pair)
    for c in (pair.pub, pair.sub):
        c.execute("CREATE ROLE pwuser LOGIN SUPERUSER REPLICATION PASSWORD 'right'")
    wrong = pair.workdir / "wrong.pw"
    wrong.write_text("wrong\n")
    sides = (("source", pair.pub, pair.pub_db), ("target", pair.sub, pair.sub_db))
    for side, cluster, db in sides:
        dsn = cluster.dsn(db, user="pwuser")
        cfg = _config(pair, **{side: {"dsn": dsn, "password_file": str(wrong)}})
        for command, (rc, err) in _each_command(cfg).items():
            assert rc == EXIT_USAGE, (side, command, err[-3000:])
            line = _one_error_line(err)
            assert "password authentication failed" in line and "password_file" in line, line
            assert "wrong" not in line.replace("wrong.pw", "")  # the password itself never shows
        assert _slots(pair) == []


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_misspelled_publication_is_refused_before_streaming(pair: Pair) -> None:
    _table(pair)
    pair.pub_exec("CREATE PUBLICATION other FOR TABLE t")
    cfg = _config(pair, "info", source={"publications": ["pub", "pubx"]})
    rc, err = _cli("run", cfg)
    assert rc == EXIT_USAGE, err
    line = _one_error_line(err)
    assert "'pubx'" in line and "'other', 'pub'" in line and "[source] publications" in line
    assert "replication started" not in err and "connected" not in err
    assert _slots(pair) == []


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
@pytest.mark.parametrize("command", ["bootstrap", "sync-sequences", "decode"])
def test_misspelled_publication_in_other_commands(pair: Pair, command: str) -> None:
    _table(pair)
    if command == "decode":
        pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput')")
    cfg = _config(pair, source={"publications": ["pubx"]})
    rc, err = _cli(command, cfg)
    assert rc == EXIT_USAGE, err[-3000:]
    line = _one_error_line(err)
    assert "'pubx'" in line and "'pub'" in line, line
    if command != "decode":
        assert _slots(pair) == []


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_non_empty_target_table_is_exit_3_before_spark(pair: Pair) -> None:
    _table(pair)
    pair.sub_exec("INSERT INTO t VALUES (1, 'target only')")
    rc, err = _cli(
        "bootstrap",
        _config(
            pair,
        ),
    )
    assert rc == EXIT_PERMANENT, err[-3000:]
    line = _one_error_line(err)
    assert "public.t" in line and "not empty" in line and "--truncate" in line, line
    assert "Spark" not in err and "spark" not in err.replace("[spark]", "")
    assert _slots(pair) == []


def test_pg_dump_older_than_the_source_is_permanent(pool: ClusterPool) -> None:
    """PostgreSQL 15's pg_dump against an 18 server: its refusal is exit 3 (a newer
    pg_dump is needed; a restart runs the same one again)."""
    from applier.bootstrap.schema import dump_failure
    from applier.localpg import bin_dir

    server = pool.get("pub", 18)
    proc = subprocess.run(
        [str(bin_dir(15) / "pg_dump"), "--schema-only", f"--dbname={server.dsn()}"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode != 0 and "version mismatch" in proc.stderr, proc.stderr
    err = dump_failure(proc.stderr)
    assert err.exit_code == EXIT_PERMANENT
    assert "\n" not in str(err) and "18" in str(err) and "15" in str(err), str(err)
    assert err.hint and "pg_dump" in err.hint


@pytest.mark.parametrize("pair", ["15-18", "18-18"], indirect=True)  # 16 reworded the refusal
@pytest.mark.parametrize("command", ["run", "decode"])
def test_source_role_without_replication_is_exit_3(pair: Pair, command: str) -> None:
    """A role without REPLICATION is refused its walsender at every try: a person
    must ALTER ROLE, so the command stops (exit 3) naming it, never retries."""
    _table(pair)
    pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput')")
    pair.pub_exec(
        "DO $$ BEGIN CREATE ROLE norepl LOGIN; EXCEPTION WHEN duplicate_object THEN END $$"
    )
    pair.pub_exec("GRANT SELECT ON t TO norepl")
    cfg = _config(pair, source={"dsn": pair.pub.dsn(pair.pub_db, user="norepl")})
    rc, err = _cli(command, cfg)
    assert rc == EXIT_PERMANENT, err[-3000:]
    line = _one_error_line(err)
    assert "REPLICATION" in line and "ALTER ROLE" in line, line
