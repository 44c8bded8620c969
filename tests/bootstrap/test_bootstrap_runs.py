"""Bootstrap under concurrent writes, killed midway and rerun, and on bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import ONE_PAIR, Pair

from applier.bootstrap.job import run_bootstrap
from applier.errors import BootstrapError, SourceError

pytestmark = pytest.mark.spark


def _cli(*args: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "applier.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip


def _wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _same(pair: Pair, table: str) -> bool:
    q = f"SELECT count(*), md5(string_agg(t::text, ',' ORDER BY t::text)) FROM {table} t"
    return pair.pub_exec(q) == pair.sub_exec(q)


class Writer(threading.Thread):
    """Inserts and updates on the source in small transactions until stopped."""

    def __init__(self, pair: Pair) -> None:
        super().__init__(daemon=True)
        self.pair, self.stop_ev, self.commits = pair, threading.Event(), 0

    def run(self) -> None:
        with self.pair.pub_conn() as conn:
            i = 0
            while not self.stop_ev.is_set():
                i += 1
                with conn.transaction():
                    conn.execute("INSERT INTO w (v) VALUES (%s)", (f"new{i}",))
                    conn.execute("INSERT INTO wn VALUES (%s, %s)", (i, "x"))
                    conn.execute("UPDATE w SET v = v || '+' WHERE id = %s", (i * 7 % 3000 + 1,))
                self.commits += 1
                time.sleep(0.002)


@ONE_PAIR
def test_concurrent_writes_arrive_exactly_once(pair: Pair, spark: Any) -> None:
    pair.pub_exec(
        "CREATE TABLE w (id serial PRIMARY KEY, v text);"
        "CREATE TABLE wn (a int, b text); ALTER TABLE wn REPLICA IDENTITY FULL;"
        "INSERT INTO w (v) SELECT 'old' || g FROM generate_series(1, 3000) g;"
        "CREATE PUBLICATION pub FOR TABLE w, wn;"
    )
    cfg_path = pair.write_config(bootstrap={"slice_size": "16kB"})
    from applier.config import load_config

    cfg = load_config(cfg_path)
    writer = Writer(pair)
    writer.start()
    try:
        _wait(lambda: writer.commits > 20, 20, "writes before the bootstrap")
        assert run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True) == 0
        during = writer.commits
        time.sleep(0.5)
    finally:
        writer.stop_ev.set()
        writer.join()
    assert writer.commits > during > 20
    # The apply worker continues from the origin: every later write exactly once.
    proc = _cli("run", "--config", str(cfg_path))
    try:
        _wait(lambda: _same(pair, "w") and _same(pair, "wn"), 60, "the worker to catch up")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    n = pair.sub_exec("SELECT count(*), count(DISTINCT a) FROM wn")[0]
    assert n[0] == n[1] == writer.commits


@ONE_PAIR
def test_killed_bootstrap_rerun_converges(pair: Pair, spark: Any, tmp_path: Path) -> None:
    pair.pub_exec(
        "CREATE TABLE k (id serial PRIMARY KEY, pad text);"
        # ~70 slices of 64kB: the kill comes after 5 or so, the rerun copies the rest
        # (60000 rows made ~215 slices, whose per-task overhead was most of the test).
        "INSERT INTO k (pad) SELECT repeat('x', 200) FROM generate_series(1, 20000) g;"
        "CREATE TABLE k2 (id int); INSERT INTO k2 SELECT generate_series(1, 1000);"
        "CREATE PUBLICATION pub FOR TABLE k, k2 WITH (publish = 'insert');"
    )
    cfg_path = pair.write_config(
        bootstrap={"slice_size": "64kB", "spark_master": "local[1]"}, logging={"level": "info"}
    )
    proc = _cli("bootstrap", "--config", str(cfg_path), "--quiet", start_new_session=True)

    def some_done() -> bool:
        try:
            n = pair.sub_exec("SELECT count(*) FROM applier.bootstrap_slice")[0][0]
        except psycopg.Error:
            return False
        return bool(n >= 5)

    _wait(some_done, 90, "some slices to be copied")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert pair.sub_exec("SELECT phase FROM applier.bootstrap_run") == [("copy",)]
    partial = pair.sub_exec("SELECT count(*) FROM k")[0][0]
    assert 0 < partial < 20000
    # Autovacuum stays off on the tables being loaded, until their post-data DDL.
    reloptions = "SELECT reloptions FROM pg_class WHERE relname = 'k'"
    assert pair.sub_exec(reloptions) == [(["autovacuum_enabled=false"],)]
    # More writes while no bootstrap runs; the rerun must include them.
    pair.pub_exec("INSERT INTO k (pad) VALUES ('late'); DELETE FROM k WHERE id = 5;")
    from applier.config import load_config

    assert (
        run_bootstrap(load_config(cfg_path), recreate_slot=False, truncate=False, quiet=True) == 0
    )
    assert _same(pair, "k") and _same(pair, "k2")
    assert pair.sub_exec("SELECT phase FROM applier.bootstrap_run") == [("done",)]
    assert pair.sub_exec(reloptions) == [(None,)]  # the source's setting: none


# -- bad input -----------------------------------------------------------------------


# Refused on the source before the target is opened: the target's version is moot.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_missing_publication_cli_exit_code(pair: Pair) -> None:
    pair.pub_exec("CREATE TABLE t (id int PRIMARY KEY)")
    proc = _cli("bootstrap", "--config", str(pair.write_config()), "--quiet")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2  # the config names what the source lacks: no restart fixes it
    assert " applier: error: publication(s) 'pub' do not" in err.strip().splitlines()[-1]


# Refused on the source before the target is opened: the target's version is moot.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_unreachable_source(pair: Pair) -> None:
    cfg = pair.config(source={"dsn": "host=127.0.0.1 port=1 dbname=x connect_timeout=2"})
    with pytest.raises(SourceError, match="cannot connect to the source"):
        run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True)


def test_missing_type_refused(pair: Pair) -> None:
    pair.pub_exec(
        "CREATE DOMAIN posint AS int CHECK (VALUE > 0);"
        "CREATE TABLE t (id posint PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t;"
    )
    with pytest.raises(
        BootstrapError, match=r"type public\.posint .* does not exist on the target"
    ) as info:
        run_bootstrap(pair.config(), recreate_slot=False, truncate=False, quiet=True)
    assert info.value.exit_code == 3  # a rerun finds the type missing again (issue 31, item 8)
    assert pair.pub_exec(
        "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()"
    ) == [(0,)]


@ONE_PAIR
def test_non_empty_target_needs_truncate(pair: Pair, spark: Any) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("INSERT INTO t VALUES (1, 'a'); CREATE PUBLICATION pub FOR TABLE t;")
    pair.sub_exec("INSERT INTO t VALUES (9, 'old')")
    cfg = pair.config()
    with pytest.raises(BootstrapError, match=r"public\.t are not empty.*--truncate"):
        run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True)
    assert run_bootstrap(cfg, recreate_slot=False, truncate=True, quiet=True) == 0
    assert pair.sub_exec("SELECT * FROM t") == [(1, "a")]


@ONE_PAIR
def test_copy_failure_is_one_line_and_rerun_finishes(pair: Pair, spark: Any) -> None:
    pair.pub_exec(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        "INSERT INTO t SELECT g, CASE WHEN g = 50 THEN 'oops' ELSE g::text END "
        "FROM generate_series(1, 100) g; CREATE PUBLICATION pub FOR TABLE t;"
    )
    pair.sub_exec("CREATE TABLE t (id int PRIMARY KEY, v int)")
    cfg = pair.config()
    with pytest.raises(
        BootstrapError, match=r"Spark bootstrap job failed: .*invalid input syntax"
    ) as ei:
        run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True)
    assert "\n" not in str(ei.value)
    pair.pub_exec("UPDATE t SET v = '50' WHERE id = 50")
    assert run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True) == 0
    assert pair.sub_exec("SELECT count(*), sum(v) FROM t") == [(100, 5050)]


# -- a one-shot job at every start (docker compose) ----------------------------------


@ONE_PAIR
def test_if_needed_is_a_no_op_once_the_slot_was_bootstrapped(pair: Pair, spark: Any) -> None:
    pair.pub_exec(
        "CREATE TABLE once (id int PRIMARY KEY); INSERT INTO once VALUES (1), (2);"
        "CREATE PUBLICATION pub FOR TABLE once;"
    )
    cfg_path = pair.write_config()
    from applier.config import load_config

    cfg = load_config(cfg_path)
    assert run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True) == 0
    origin = "SELECT remote_lsn::text FROM pg_replication_origin_status"
    before = pair.sub_exec(origin)
    # Without the flag a second bootstrap is an error a rerun meets again (exit 3) ...
    proc = _cli("bootstrap", "--config", str(cfg_path), "--quiet")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert "bootstrapped already" in err
    # ... with it, success without touching anything: compose's `applier` service,
    # which waits for the bootstrap service to complete successfully, starts again.
    proc = _cli("bootstrap", "--config", str(cfg_path), "--quiet", "--if-needed")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "bootstrapped already" in err
    assert pair.sub_exec(origin) == before
    assert pair.sub_exec("SELECT phase FROM applier.bootstrap_run") == [("done",)]
