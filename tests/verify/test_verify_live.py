"""``applier verify`` while a writer writes and ``applier run`` applies; its exit codes."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from apply.applykit import ROOT, Runner, wait_equal
from bootstrap.helpers import load
from conftest import Pair

from applier.bootstrap.job import run_bootstrap
from applier.config import load_config
from applier.verify import run_verify

pytestmark = pytest.mark.spark


class Writer(threading.Thread):
    """Random single-row UPDATEs, INSERTs and DELETEs on the source, each its own transaction."""

    def __init__(self, pair: Pair) -> None:
        super().__init__(name="writer", daemon=True)
        self.pair = pair
        self.stop = threading.Event()
        self.txns = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rnd = random.Random(7)
        try:
            with self.pair.pub_conn(autocommit=True) as conn:
                while not self.stop.is_set():
                    op = rnd.random()
                    if op < 0.6:
                        conn.execute(
                            "UPDATE big SET n = n + 1, payload = md5(random()::text) WHERE id = %s",
                            (rnd.randint(1, 20_000),),
                        )
                    elif op < 0.8:
                        # Explicit keys: sequences are not replicated (a used
                        # one would be "behind" on the target, a true difference).
                        conn.execute(
                            "INSERT INTO big (id, payload, n) VALUES (%s, 'new', 0)",
                            (100_000 + self.txns,),
                        )
                    elif op < 0.9:
                        conn.execute("DELETE FROM big WHERE id = %s", (rnd.randint(1, 20_000),))
                    else:
                        conn.execute("INSERT INTO nopk VALUES (%s, 'w')", (self.txns,))
                    self.txns += 1
                    time.sleep(0.002)
        except BaseException as e:  # reported by the test
            self.error = e


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_no_false_reports_while_writes_go_on(
    pair: Pair, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    load(pair)
    path = pair.write_config(bootstrap={"slice_size": "1MB"}, verify={"fetch_rows": 100})
    cfg = load_config(path)
    assert run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True) == 0
    runner = Runner(pair, path).start().ready()
    writer = Writer(pair)
    writer.start()
    # The worker is paused for a while during the verify: the target falls
    # behind the source by seconds of writes, which ranges hashed meanwhile
    # must wait out (or recheck), not report.
    pause = threading.Timer(0.3, _pause, (runner, 2.0))
    try:
        time.sleep(0.5)
        before = writer.txns
        pause.start()
        rc = run_verify(cfg, chunk_rows=1000, rounds=3, as_json=True)
        during = writer.txns - before
    finally:
        pause.join(10)
        writer.stop.set()
        writer.join(10)
    assert writer.error is None, writer.error
    report = json.loads(capsys.readouterr().out)
    found = {t["table"]: t["differences"] for t in report["tables"] if t["differences"]}
    assert rc == 0 and report["equal"], (found, report["schema"], runner.log()[-3000:])
    assert during > 50  # the verify really ran while the source changed
    assert runner.alive()


def _pause(runner: Runner, seconds: float) -> None:
    runner.signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        runner.signal(signal.SIGCONT)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", "verify", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_exit_codes_usage_and_incomplete(pair: Pair, tmp_path: Path) -> None:
    path = pair.write_config()
    bad = _cli("--config", str(path), "--tables", "nodot")
    assert bad.returncode == 2, bad.stderr
    assert "schema.table" in bad.stderr
    # A source that does not answer: the verify could not complete (3), not "differences" (1).
    down = tmp_path / "down.toml"
    down.write_text(
        path.read_text().replace(pair.pub_dsn, "host=127.0.0.1 port=1 dbname=x connect_timeout=2")
    )
    incomplete = _cli("--config", str(down))
    assert incomplete.returncode == 3, incomplete.stderr
    assert "cannot connect to the source" in incomplete.stderr


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_sequences_behind_while_replicating_are_not_a_difference(
    pair: Pair, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31, item 7: every sequence is behind the source until sync-sequences runs at
    cutover, so verify during live replication always exited 1. Now they are reported
    as not yet synced; --strict-sequences (and cutover --verify) still fail on them."""
    pair.both("CREATE TABLE s (id serial PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE s")
    path = pair.write_config()
    runner = Runner(pair, path).start().ready()
    pair.pub_exec("INSERT INTO s (v) SELECT 'r' || g FROM generate_series(1, 50) g")
    wait_equal(pair, ["s"], runner=runner)
    cfg = load_config(path)

    assert run_verify(cfg, rounds=1) == 0
    out = capsys.readouterr().out
    assert "public.s_id_seq" in out and "not yet synced" in out, out
    assert "applier sync-sequences" in out, out
    assert run_verify(cfg, rounds=1, as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["equal"] is True and report["schema"] == []
    assert [s["name"] for s in report["sequences_not_synced"]] == ["public.s_id_seq"]

    assert run_verify(cfg, rounds=1, as_json=True, strict_sequences=True) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(s["kind"], s["name"]) for s in report["schema"]] == [("sequence", "public.s_id_seq")]
    assert runner.stop() == 0
