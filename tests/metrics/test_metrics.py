"""The Prometheus endpoint of `applier run` ([metrics] listen), scraped over HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from apply.applykit import ROOT, Runner, origin_lsn, wait_equal, wait_for
from conftest import Pair
from prometheus_client.parser import text_string_to_metric_families

from applier.lsn import Lsn

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def get(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def by_label(samples: Samples, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(dict(labels)[k] for k in keys): v
        for (n, labels), v in samples.items()
        if n == name and v
    }


def start(pair: Pair, port: int, **sections: Any) -> Runner:
    cfg = pair.write_config(metrics={"listen": f"127.0.0.1:{port}"}, **sections)
    return Runner(pair, cfg).start().ready()


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_counters_and_positions_match_what_was_applied(pair: Pair) -> None:
    """Changes by table and operation, transactions, skipped changes and conflicts equal
    what the source did; the LSN gauges agree with the origin and the slot; lag is 0
    once idle; the slot's retained WAL is shown."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.both("CREATE TABLE c (id int PRIMARY KEY, v text)")
    pair.both("CREATE TABLE x (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.pub_exec("INSERT INTO c VALUES (1, 'a'), (2, 'b')")  # before the slot: not on target
    port = free_port()
    runner = start(pair, port, tables={"include": ["*.*"], "exclude": ["public.x"]})
    # The slot turns active during START_REPLICATION, a moment before the worker
    # holds the started stream: a scrape in between rightly reads 0.
    wait_for(lambda: get(scrape(port), "applier_up") == 1, 10, "applier_up")
    first = scrape(port)
    assert get(first, "applier_applied_transactions_total") == 0
    for i in range(3):
        rows = ", ".join(f"({i * 10 + k}, 'r')" for k in range(10))
        pair.pub_exec(f"INSERT INTO t VALUES {rows}")
    pair.pub_exec("UPDATE t SET v = 'u' WHERE id < 5")
    pair.pub_exec("DELETE FROM t WHERE id >= 28")
    pair.pub_exec("INSERT INTO x VALUES (1), (2)")  # excluded: skipped, no target txn
    pair.pub_exec("UPDATE c SET v = 'x' WHERE id = 1")  # update_missing: skip
    pair.pub_exec("DELETE FROM c WHERE id = 2")  # delete_missing: skip
    wait_equal(pair, ["t"], runner=runner)
    wait_for(
        lambda: get(scrape(port), "applier_applied_transactions_total") == 7, 30, "7 txns counted"
    )
    m = scrape(port)
    assert by_label(m, "applier_applied_changes_total", "table", "operation") == {
        ("public.t", "insert"): 30,
        ("public.t", "update"): 5,
        ("public.t", "delete"): 2,
        ("public.c", "update"): 1,
        ("public.c", "delete"): 1,
    }
    assert by_label(m, "applier_skipped_changes_total", "table", "reason") == {
        ("public.x", "excluded"): 2
    }
    assert by_label(m, "applier_conflicts_total", "table", "type", "resolution") == {
        ("public.c", "update_missing", "skip"): 1,
        ("public.c", "delete_missing", "skip"): 1,
    }
    # Every committed source transaction is in exactly one group.
    assert get(m, "applier_group_size_sum") == 7
    assert get(m, "applier_group_size_bucket", le="+Inf") == get(m, "applier_group_size_count")
    assert get(m, "applier_apply_errors_total") == 0
    assert get(m, "applier_reconnects_total", side="target") == 0
    assert get(m, "applier_spool_bytes", where="memory") == 0

    # Idle: caught up, and the positions agree with the target's origin and the slot.
    def settled() -> bool:
        s = scrape(port)
        slot = pair.pub_exec(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
            f"WHERE slot_name = '{pair.slot}'"
        )[0][0]
        return (
            get(s, "applier_lag_bytes") == 0
            and get(s, "applier_lag_seconds") == 0
            and get(s, "applier_confirmed_lsn") == Lsn.parse(slot)
        )

    wait_for(settled, 30, "lag 0 and the slot confirmed")
    m = scrape(port)
    origin = origin_lsn(pair, pair.slot)
    assert origin is not None
    assert get(m, "applier_applied_lsn") == Lsn.parse(origin)
    received = get(m, "applier_received_lsn")
    assert received is not None and received >= Lsn.parse(origin)
    retained = get(m, "applier_slot_retained_wal_bytes")
    assert retained is not None and retained >= 0
    assert get(m, "process_resident_memory_bytes")  # the standard collectors stay
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_a_replayed_group_counts_once(pair: Pair) -> None:
    """A group that fails on a conflict a policy takes is rolled back and replayed
    carefully: its changes count once, at the commit, with the conflict."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, u int UNIQUE)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    port = free_port()
    cfg = pair.write_config(metrics={"listen": f"127.0.0.1:{port}"})
    cfg.write_text(cfg.read_text() + '\n[conflicts]\ndefault = { update_exists = "skip" }\n')
    assert Runner(pair, cfg, "slot.log").start().ready().stop() == 0  # the slot
    pair.sub_exec("INSERT INTO t VALUES (100, 99)")  # a local row holding u = 99
    # A backlog: the three transactions arrive together and share one group.
    pair.pub_exec("INSERT INTO t VALUES (1, 1), (2, 2), (3, 3)")
    pair.pub_exec("UPDATE t SET u = 99 WHERE id = 2")  # update_exists: skip
    pair.pub_exec("INSERT INTO t VALUES (4, 4)")
    runner = Runner(pair, cfg).start().ready()
    wait_for(lambda: get(scrape(port), "applier_applied_transactions_total") == 3, 60, "3 txns")
    m = scrape(port)
    assert by_label(m, "applier_applied_changes_total", "table", "operation") == {
        ("public.t", "insert"): 4,
        ("public.t", "update"): 1,
    }
    assert by_label(m, "applier_conflicts_total", "table", "type", "resolution") == {
        ("public.t", "update_exists", "skip"): 1
    }
    assert (get(m, "applier_apply_errors_total") or 0) >= 1  # the failed group
    assert get(m, "applier_group_size_sum") == 3
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_lag_seconds_grows_while_the_target_blocks(pair: Pair) -> None:
    """Behind (a lock on the target holds the apply), lag in bytes and seconds grows: the
    seconds from the blocked transaction's commit (applier.lag); back to 0 once applied."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    port = free_port()
    runner = start(pair, port)
    pair.pub_exec("INSERT INTO t VALUES (1)")
    wait_equal(pair, ["t"], runner=runner)
    wait_for(lambda: get(scrape(port), "applier_lag_seconds") == 0, 30, "caught up")
    with pair.sub_conn(autocommit=False) as lock:
        lock.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        time.sleep(1.0)  # the worker was caught up for a second
        pair.pub_exec("INSERT INTO t VALUES (2)")
        wait_for(lambda: (get(scrape(port), "applier_lag_bytes") or 0) > 0, 30, "lag bytes")
        time.sleep(1.5)
        m = scrape(port)
        lag = get(m, "applier_lag_seconds")
        # The age of the blocked commit: at least the 1.5 s waited after the lag showed
        # in bytes; not the age of the commit applied before it (2.5 s and more).
        assert lag is not None and 1.4 <= lag < 2.4, lag
        time.sleep(0.5)
        lag2 = get(scrape(port), "applier_lag_seconds")
        assert lag2 is not None and lag2 > lag
        lock.rollback()
    wait_equal(pair, ["t"], runner=runner)
    wait_for(lambda: get(scrape(port), "applier_lag_seconds") == 0, 30, "caught up again")
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_reconnects_count_the_side_that_failed(pair: Pair) -> None:
    """A terminated apply backend counts a target reconnect, a terminated walsender a
    source one; the counts of applied changes stay exact across the replays."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    port = free_port()
    runner = start(pair, port)
    pair.pub_exec("INSERT INTO t VALUES (1)")
    wait_equal(pair, ["t"], runner=runner)
    pair.sub_exec(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'applier apply'"
        f" AND datname = '{pair.sub_db}'"
    )
    pair.pub_exec("INSERT INTO t VALUES (2)")
    wait_for(
        lambda: get(scrape(port), "applier_reconnects_total", side="target") == 1,
        60,
        "a target reconnect",
    )
    wait_equal(pair, ["t"], runner=runner)
    pair.pub_exec(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
        f"WHERE slot_name = '{pair.slot}'"
    )
    pair.pub_exec("INSERT INTO t VALUES (3)")
    wait_for(
        lambda: get(scrape(port), "applier_reconnects_total", side="source") == 1,
        60,
        "a source reconnect",
    )
    wait_equal(pair, ["t"], runner=runner)
    wait_for(lambda: get(scrape(port), "applier_up") == 1, 30, "streaming again")
    m = scrape(port)
    assert get(m, "applier_reconnects_total", side="target") == 1
    assert get(m, "applier_applied_changes_total", table="public.t", operation="insert") == 3
    assert runner.stop() == 0


def _run(cfg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def _config(tmp_path: Path, listen: str) -> Path:
    path = tmp_path / "applier.toml"
    path.write_text(
        '[source]\ndsn = "host=127.0.0.1 port=1 dbname=x"\npublications = ["p"]\n'
        '[target]\ndsn = "host=127.0.0.1 port=1 dbname=y"\n'
        f"[metrics]\nlisten = {listen!r}\n".replace("'", '"')
    )
    return path


@pytest.mark.parametrize("listen", ["9187", "localhost:0", "[::1]:99999", "host:port"])
def test_bad_listen_exits_2(tmp_path: Path, listen: str) -> None:
    done = _run(_config(tmp_path, listen))
    assert done.returncode == 2, done.stderr
    assert "metrics.listen" in done.stderr and "HOST:PORT" in done.stderr, done.stderr


def test_port_in_use_exits_2(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = _run(_config(tmp_path, f"127.0.0.1:{port}"))
    assert done.returncode == 2, done.stderr
    assert "cannot listen" in done.stderr and str(port) in done.stderr, done.stderr
