"""``applier cutover``: catch up (with a running worker or without), sync sequences, report."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import CORE_PAIRS, ONE_PAIR, Pair

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apply"))
from applykit import ROOT, Runner, table_rows, wait_equal, wait_for


def _setup(pair: Pair) -> tuple[Path, Runner]:
    """A table with a sequence, a publication, the slot and origin (one short run)."""
    pair.both("CREATE TABLE t (id serial PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    runner = Runner(pair, cfg)
    runner.start().ready()
    assert runner.stop() == 0
    return cfg, runner


def _write(pair: Pair, n: int) -> None:
    for i in range(n):
        pair.pub_exec(f"INSERT INTO t (v) VALUES ('v{i}')")


def _cutover(cfg: Path, *args: str, timeout: float = 120) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "cutover", "--config", str(cfg), "--json", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, report, proc.stderr


def _seq(query: Any) -> int:
    return int(query("SELECT last_value FROM t_id_seq")[0][0])


def _assert_caught_up(pair: Pair, rc: int, rep: dict[str, Any], err: str) -> None:
    assert rc == 0, (rep, err[-3000:])
    assert rep["caught_up"] is True and rep["code"] == 0, rep
    assert rep["sequences_set"] == 1, rep
    assert rep["lag_bytes_at_start"] is not None and rep["catch_up_seconds"] is not None, rep
    assert table_rows(pair.pub_exec, "t") == table_rows(pair.sub_exec, "t")
    assert _seq(pair.sub_exec) == _seq(pair.pub_exec) == 20
    assert any("point the application at the target" in s for s in rep["next_steps"]), rep


@ONE_PAIR
def test_cutover_without_a_worker_applies_in_process(pair: Pair) -> None:
    cfg, _ = _setup(pair)
    _write(pair, 20)  # then writes stop
    assert _seq(pair.sub_exec) == 1  # the sequence is not replicated
    rc, rep, err = _cutover(cfg)
    _assert_caught_up(pair, rc, rep, err)
    assert rep["mode"].startswith("applied in-process"), rep
    assert rep["lag_bytes_at_start"] > 0, rep
    assert rep["verify"] == "not run"


@pytest.mark.parametrize("pair", CORE_PAIRS, indirect=True)
def test_cutover_with_a_running_worker_waits_for_it(pair: Pair) -> None:
    cfg, runner = _setup(pair)
    runner.start().ready()
    _write(pair, 20)
    rc, rep, err = _cutover(cfg)
    _assert_caught_up(pair, rc, rep, err)
    assert rep["mode"] == "waited for the running worker", rep
    assert runner.alive()  # the cutover never touches the worker
    # The text report, as a person reads it.
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "cutover", "--config", str(cfg)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "caught up" in proc.stdout and "sequences set" in proc.stdout, proc.stdout
    assert "to roll back" in proc.stdout, proc.stdout
    assert runner.stop() == 0


@ONE_PAIR
def test_cutover_names_the_error_the_worker_stopped_on(pair: Pair) -> None:
    cfg, runner = _setup(pair)
    pair.sub_exec("INSERT INTO t VALUES (5, 'diverged')")
    _write(pair, 10)
    runner.start()
    assert runner.wait(60) == 3  # stopped on the duplicate key
    rc, rep, err = _cutover(cfg, "--timeout", "30")
    assert rc == 3, (rep, err[-3000:])
    assert rep["caught_up"] is False and rep["sequences_set"] is None, rep
    assert "23505" in rep["error"] and "public.t" in rep["error"], rep
    assert any("do not switch yet" in s for s in rep["next_steps"]), rep


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_cutover_timeout_while_the_worker_is_blocked(pair: Pair) -> None:
    cfg, runner = _setup(pair)
    runner.start().ready()
    with pair.sub_conn() as blocker:
        blocker.execute("BEGIN")
        blocker.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")  # the worker waits for it
        _write(pair, 20)
        t0 = time.monotonic()
        rc, rep, err = _cutover(cfg, "--timeout", "3")
        assert rc == 3, (rep, err[-3000:])
        assert time.monotonic() - t0 < 30
        assert "timed out" in rep["error"], rep
        blocker.execute("ROLLBACK")
    wait_for(runner.alive, 5, "the worker to be alive")
    rc, rep, err = _cutover(cfg)
    _assert_caught_up(pair, rc, rep, err)
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_cutover_in_process_timeout(pair: Pair) -> None:
    cfg, _ = _setup(pair)
    with pair.sub_conn() as blocker:
        blocker.execute("BEGIN")
        blocker.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        _write(pair, 20)
        t0 = time.monotonic()
        rc, rep, err = _cutover(cfg, "--timeout", "3")
        assert rc == 3, (rep, err[-3000:])
        assert time.monotonic() - t0 < 40
        assert "timed out" in rep["error"], rep
        assert rep["mode"].startswith("applied in-process"), rep
        blocker.execute("ROLLBACK")
    rc, rep, err = _cutover(cfg)
    _assert_caught_up(pair, rc, rep, err)


@pytest.mark.spark
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_cutover_verify_equal_then_different(pair: Pair) -> None:
    _, runner = _setup(pair)
    cfg = pair.write_config(bootstrap={"spark_master": "local[1]"})
    runner.start().ready()
    _write(pair, 20)
    rc, rep, err = _cutover(cfg, "--verify", timeout=300)
    _assert_caught_up(pair, rc, rep, err)
    assert rep["verify"] == "equal", rep
    pair.sub_exec("UPDATE t SET v = 'changed on the target' WHERE id = 3")
    rc, rep, err = _cutover(cfg, "--verify", timeout=300)
    assert rc == 1, (rep, err[-3000:])
    assert rep["caught_up"] is True and rep["verify"].startswith("differences"), rep
    assert any("do not switch" in s for s in rep["next_steps"]), rep
    assert runner.stop() == 0


#: Longer than rich's 80 columns with the other columns, within 63 bytes (NAMEDATALEN).
LONG = "measurements_per_station_and_hour_since_the_network_went_live"


def _piped(*args: str) -> subprocess.CompletedProcess[str]:
    """A command as a script runs it: stdout and stderr pipes, no terminal."""
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.spark
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_verify_and_cutover_name_the_table_that_differs(pair: Pair) -> None:
    """Piped, as into a file: the verify table keeps the long name whole, cutover
    --verify names the table that differs, a table without a replica identity is
    warned about once, and the JVM's start-up warning is not passed on."""
    pair.both(f"CREATE TABLE {LONG} (id int PRIMARY KEY, v text); CREATE TABLE nokey (v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(bootstrap={"spark_master": "local[1]"})
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec(
        f"INSERT INTO {LONG} SELECT g, 'v' FROM generate_series(1, 50) g;"
        "INSERT INTO nokey VALUES ('a')"
    )
    wait_equal(pair, [LONG, "nokey"], runner=runner)
    pair.sub_exec(f"UPDATE {LONG} SET v = 'changed on the target' WHERE id = 3")

    verify = _piped("verify", "--config", str(cfg))
    assert verify.returncode == 1, verify.stdout + verify.stderr[-3000:]
    assert f"public.{LONG}" in verify.stdout and "…" not in verify.stdout, verify.stdout
    assert "Using incubator modules" not in verify.stderr, verify.stderr

    cut = _piped("cutover", "--config", str(cfg), "--verify")
    assert cut.returncode == 1, cut.stdout + cut.stderr[-3000:]
    (line,) = [ln for ln in cut.stdout.splitlines() if ln.strip().startswith("verify ")]
    assert f"public.{LONG}" in line and "1 row" in line, cut.stdout
    assert "nokey" not in line, cut.stdout  # equal: not named
    assert cut.stderr.count("nokey has no replica identity") == 1, cut.stderr
    assert "Using incubator modules" not in cut.stderr, cut.stderr
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_cutover_names_the_error_of_the_worker_it_waits_for(pair: Pair) -> None:
    cfg, runner = _setup(pair)
    runner.start().ready()
    pair.sub_exec("INSERT INTO t VALUES (5, 'diverged')")
    with pair.sub_conn() as blocker:
        blocker.execute("BEGIN")
        blocker.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")  # holds the worker back
        _write(pair, 10)
        proc = subprocess.Popen(
            [sys.executable, "-m", "applier.cli", "cutover", "--config", str(cfg), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        time.sleep(3)  # the cutover found the worker running and waits for it
        blocker.execute("ROLLBACK")
    out, err = proc.communicate(timeout=60)
    assert runner.wait(30) == 3  # the duplicate key stopped it
    assert proc.returncode == 3, (out, err[-3000:])
    rep = json.loads(out)
    assert rep["mode"] == "waited for the running worker", rep
    assert "the worker stopped on an error" in rep["error"], rep
    assert "23505" in rep["error"] and "public.t" in rep["error"], rep


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_cutover_refuses_without_the_slot(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id serial PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    rc, rep, err = _cutover(pair.write_config())
    assert rc == 3, (rep, err[-3000:])
    assert "does not exist" in rep["error"], rep
    # It created nothing: no slot appeared.
    assert not pair.pub_exec(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{pair.slot}'")
