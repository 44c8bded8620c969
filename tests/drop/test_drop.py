"""``applier drop`` removes exactly what applier created: slot, origin, applier schema."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Pair

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apply"))
from applykit import Runner, wait_equal


def _drop(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "drop", "--config", str(cfg), *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _present(pair: Pair) -> tuple[bool, bool, bool]:
    """(slot on the source, origin on the target, applier schema on the target)."""
    slot = pair.pub.execute(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{pair.slot}'")
    origin = pair.sub.execute(f"SELECT 1 FROM pg_replication_origin WHERE roname = '{pair.slot}'")
    schema = pair.sub_exec("SELECT 1 FROM pg_namespace WHERE nspname = 'applier'")
    return bool(slot), bool(origin), bool(schema)


def _set_up(pair: Pair) -> Path:
    """A run without bootstrap (it creates slot, origin and schema), some rows, a stop."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t SELECT generate_series(1, 10)")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    assert _present(pair) == (True, True, True)
    return cfg


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_drop_removes_exactly_what_applier_created(pair: Pair) -> None:
    cfg = _set_up(pair)
    other = f"{pair.slot}_other"  # a second source's slot on the same server
    pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{other}', 'pgoutput')")

    dry = _drop(cfg)
    assert dry.returncode == 0, dry.stderr
    assert _present(pair) == (True, True, True)  # nothing removed
    for what in (f"slot '{pair.slot}'", f"origin '{pair.slot}'", "schema applier"):
        assert f"would remove {what}" in dry.stdout, dry.stdout
    assert "--yes" in dry.stdout

    done = _drop(cfg, "--yes")
    assert done.returncode == 0, done.stderr
    assert _present(pair) == (False, False, False), done.stdout
    assert "removed slot" in done.stdout and "removed schema applier" in done.stdout
    assert pair.sub_exec("SELECT count(*) FROM t") == [(10,)]  # the user's table stays
    assert pair.pub_exec(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{other}'")

    again = _drop(cfg, "--yes")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("absent") == 3, again.stdout


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_drop_refuses_while_a_worker_runs(pair: Pair) -> None:
    cfg = _set_up(pair)
    runner = Runner(pair, cfg, "applier2.log").start().ready()
    proc = _drop(cfg, "--yes")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "worker" in proc.stderr and "nothing removed" in proc.stderr
    assert _present(pair) == (True, True, True)  # nothing removed
    assert runner.alive()
    # --slot alone looks at the holder too.
    assert _drop(cfg, "--slot", "--yes").returncode == 1
    assert runner.stop() == 0
    assert _present(pair) == (True, True, True)


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_drop_slot_alone(pair: Pair) -> None:
    cfg = _set_up(pair)
    proc = _drop(cfg, "--slot", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert _present(pair) == (False, True, True)
    assert "origin" not in proc.stdout


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_drop_schema_shared_with_another_origin_keeps_the_other(pair: Pair) -> None:
    cfg = _set_up(pair)
    pair.sub_exec(
        "INSERT INTO applier.worker_status (origin, slot, state) VALUES ('another', 'x', 'stopped')"
    )
    proc = _drop(cfg, "--schema", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert _present(pair) == (True, True, True)  # the schema stays for 'another'
    assert "another" in proc.stdout
    rows = pair.sub_exec("SELECT origin FROM applier.worker_status ORDER BY 1")
    assert rows == [("another",)]
    assert pair.sub_exec("SELECT count(*) FROM applier.source_identity") == [(0,)]


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_drop_bad_usage_is_2(pair: Pair) -> None:
    cfg = pair.write_config()
    assert _drop(cfg, "--bogus").returncode == 2
    assert _drop(pair.workdir / "missing.toml").returncode == 2
