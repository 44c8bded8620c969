"""`applier run` under a (fake) systemd: READY, STATUS, WATCHDOG, STOPPING, SIGHUP.

The test owns the notify socket (``$NOTIFY_SOCKET``, abstract namespace) and
runs the worker as a real process on real servers.
"""

from __future__ import annotations

import itertools
import signal
import socket
import time
from collections.abc import Iterator

import pytest
from apply.applykit import Runner, wait_equal, wait_for
from conftest import Pair
from notifykit import NotifySocket
from psycopg.conninfo import make_conninfo


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    s = NotifySocket()
    try:
        yield s
    finally:
        s.close()


_WAITING = (
    "SELECT count(*) FROM pg_locks WHERE NOT granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_ready_after_streaming_then_watchdog_stops_while_a_lock_blocks_the_apply(
    pair: Pair, notify: NotifySocket
) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"status_interval": 0.5})
    runner = Runner(pair, cfg, env=notify.env(watchdog_usec=1_000_000)).start()
    ready = notify.wait(lambda n: n.has("READY", "1"), 60, alive=runner.alive)
    # READY only once streaming started: after the checks and START_REPLICATION.
    log = runner.log()
    assert "connected" in log and "starting at the slot's position" in log, log[-3000:]
    assert not [n for n in notify.all("READY") if n.at < ready.at]
    assert pair.pub_exec(f"SELECT active FROM pg_replication_slots WHERE slot_name = '{pair.slot}'")

    # Idle but healthy: keepalives at about half the interval (0.5 s), STATUS lines.
    time.sleep(2.5)
    pings = notify.all("WATCHDOG", since=ready.at)
    assert len(pings) >= 3, notify.all()
    assert all(b.at - a.at >= 0.45 for a, b in itertools.pairwise(pings)), pings
    assert any("lag" in n.fields.get("STATUS", "") for n in notify.all(since=ready.at))

    pair.pub_exec("INSERT INTO t VALUES (1, 'a')")
    wait_equal(pair, ["t"], runner=runner)
    status = notify.wait(lambda n: "last commit" in n.fields.get("STATUS", ""), 10)
    assert "lag" in status.fields["STATUS"] and "applied 1 txns" in status.fields["STATUS"]

    # The target holds a lock the apply needs: the loop blocks, the keepalives stop.
    with pair.sub_conn(autocommit=False) as locker:
        locker.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        pair.pub_exec("UPDATE t SET v = 'b' WHERE id = 1")
        wait_for(
            lambda: pair.sub_exec(_WAITING)[0][0] > 0,
            30,
            "the apply to wait on the lock",
        )
        blocked = time.monotonic()
        time.sleep(4)
        # One last keepalive may leave between the statement and the wait for its result.
        late = notify.all("WATCHDOG", since=blocked + 1.0)
        assert late == [], f"WATCHDOG=1 while the apply was blocked: {late}"
        assert runner.alive()
        locker.rollback()
    released = time.monotonic()
    notify.wait(lambda n: n.has("WATCHDOG"), 10, since=released)
    wait_equal(pair, ["t"], runner=runner)

    runner.signal(signal.SIGTERM)
    notify.wait(lambda n: n.has("STOPPING", "1"), 10)
    assert runner.wait(60) == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_no_ready_while_the_source_is_unreachable_but_alive_and_saying_so(
    pair: Pair, notify: NotifySocket
) -> None:
    pair.pub_exec("CREATE PUBLICATION pub")
    dead = make_conninfo(pair.pub_dsn, port=str(_free_port()), connect_timeout="2")
    cfg = pair.write_config(source={"dsn": dead})
    runner = Runner(pair, cfg, env=notify.env(watchdog_usec=1_000_000)).start()
    # Retrying is alive (documented in applier.apply.beat): keepalives, and STATUS says why.
    notify.wait(lambda n: "reconnecting" in n.fields.get("STATUS", ""), 30, alive=runner.alive)
    start = time.monotonic()
    time.sleep(3)
    assert len(notify.all("WATCHDOG", since=start)) >= 2, notify.all()
    assert notify.all("READY") == []
    runner.signal(signal.SIGTERM)
    assert runner.wait(30) == 0
    assert notify.all("STOPPING")


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_sighup_reloads_log_level_keeps_running_and_survives_a_broken_config(
    pair: Pair, notify: NotifySocket
) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(logging={"level": "info"})
    runner = Runner(pair, cfg, env=notify.env(watchdog_usec=None)).start()
    notify.wait(lambda n: n.has("READY", "1"), 60, alive=runner.alive)

    def message_then_row(i: int) -> None:
        # A logical decoding message: the worker logs it at debug level only.
        pair.pub_exec(f"SELECT pg_logical_emit_message(true, 'x', 'm{i}')")
        pair.pub_exec(f"INSERT INTO t VALUES ({i})")
        wait_equal(pair, ["t"], runner=runner)

    message_then_row(1)
    assert "logical decoding message ignored" not in runner.log()

    # Debug on, and a key that needs a restart.
    cfg.write_text(pair.config_text(logging={"level": "debug"}, apply={"group_commit": 7}))
    before = time.monotonic()
    runner.signal(signal.SIGHUP)
    reloading = notify.wait(lambda n: n.has("RELOADING", "1"), 10, since=before)
    assert int(reloading.fields["MONOTONIC_USEC"]) > 0
    notify.wait(lambda n: n.has("READY", "1"), 10, since=reloading.at)
    message_then_row(2)
    log = runner.log()
    assert "logical decoding message ignored" in log
    assert "need a restart" in log and "apply.group_commit" in log
    assert runner.alive()

    # A config that no longer parses: an error in the log, the running config stays.
    cfg.write_text("[source\nthis is not toml")
    before = time.monotonic()
    runner.signal(signal.SIGHUP)
    notify.wait(lambda n: n.has("READY", "1"), 10, since=before)
    wait_for(lambda: "configuration reload failed" in runner.log(), 10, "the reload error")
    message_then_row(3)
    assert runner.alive()
    assert runner.stop() == 0
