"""One meaning of lag (applier.lag), the same in all six places that show it.

The log's "progress" line, systemd's ``STATUS=``, ``applier status`` (text and
``--json``), the ``/metrics`` endpoint and ``applier cutover``'s report: an idle
replica that is caught up shows 0 s in each; an apply blocked by a row lock on
the target shows a lag that grows in each, and 0 again once the lock is gone.
With the worker stopped, ``status`` says the seconds are not known.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from apply.applykit import ROOT, Runner, wait_equal, wait_for
from conftest import Pair
from notifykit import NotifySocket

_PROGRESS = '"msg": "progress"'
#: ``[apply] progress_interval``: each reading waits for the next progress line, so
#: the default 10 s made this test wait ~40 s for its four.
PROGRESS_EVERY = 1.0
PLACES = ("log", "STATUS=", "status", "status --json", "metrics", "cutover")

# A row lock is waited for on the holder's transaction id: no database in pg_locks.
_WAITING = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
)


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    s = NotifySocket()
    try:
        yield s
    finally:
        s.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", *args, "--config", str(cfg)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return proc


class Six:
    """Reads the lag (seconds) where each of the six places shows it."""

    def __init__(self, pair: Pair, cfg: Path, runner: Runner, notify: NotifySocket, port: int):
        self.pair, self.cfg, self.runner, self.notify, self.port = pair, cfg, runner, notify, port
        self.log_seen = 0  # progress lines already used
        self.status_seen = 0.0  # STATUS= notes already used (arrival time)

    def skip_to_now(self) -> None:
        """Read only what the worker says from now on."""
        self.log_seen = len([ln for ln in self.runner.log().splitlines() if _PROGRESS in ln])
        self.status_seen = time.monotonic()

    def log(self) -> float:
        """The lag of the next "progress" line (one every PROGRESS_EVERY s)."""
        lines: list[dict[str, Any]] = []

        def logged() -> bool:
            lines[:] = [
                json.loads(ln)
                for ln in self.runner.log().splitlines()
                if ln.startswith("{") and _PROGRESS in ln
            ]
            return len(lines) > self.log_seen

        wait_for(logged, 30, "a progress line")
        self.log_seen = len(lines)
        line = lines[-1]
        assert isinstance(line["lag_s"], float | int), line  # never "None"
        return float(line["lag_s"])

    def status_line(self) -> float:
        note = self.notify.wait(
            lambda n: "lag" in n.fields.get("STATUS", ""), 30, since=self.status_seen + 1e-6
        )
        self.status_seen = note.at
        # "lag 12 B, 0.0 s" (bytes, then seconds)
        m = re.search(r"lag (?:[\d.]+ [kMGT]?B, )?(\d+(?:\.\d+)?) ?s", note.fields["STATUS"])
        assert m, note.fields["STATUS"]
        return float(m.group(1))

    def status_text(self) -> float:
        out = _cli(self.cfg, "status").stdout
        m = re.search(r"│ lag +│ ([^│]*?) +│", out)
        assert m, out
        secs = re.search(r"(\d+(?:\.\d+)?) s\b", m.group(1))
        assert secs, m.group(1)
        return float(secs.group(1))

    def status_json(self) -> dict[str, Any]:
        return dict(json.loads(_cli(self.cfg, "status", "--json").stdout))

    def metrics(self) -> dict[str, float]:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        return {
            ln.split()[0]: float(ln.split()[1])
            for ln in text.splitlines()
            if ln.startswith("applier_lag_")
        }

    def cutover(self, *args: str) -> dict[str, Any]:
        proc = _cli(self.cfg, "cutover", "--json", *args)
        return dict(json.loads(proc.stdout))

    def seconds(self, cutover_args: tuple[str, ...] = ()) -> dict[str, float]:
        """Each place's lag in seconds, read one after the other."""
        readers: dict[str, Callable[[], Any]] = {
            "log": self.log,
            "STATUS=": self.status_line,
            "status": self.status_text,
            "status --json": lambda: self.status_json()["lag_seconds"],
            "metrics": lambda: self.metrics().get("applier_lag_seconds"),
            "cutover": lambda: self.cutover(*cutover_args)["lag_seconds_at_start"],
        }
        got = {place: readers[place]() for place in PLACES}
        assert all(isinstance(v, float | int) for v in got.values()), got
        return {k: float(v) for k, v in got.items()}


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_lag_is_0_when_caught_up_and_grows_while_a_lock_blocks_the_apply(
    pair: Pair, notify: NotifySocket
) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    port = _free_port()
    cfg = pair.write_config(
        apply={"status_interval": 0.5, "progress_interval": PROGRESS_EVERY},
        metrics={"listen": f"127.0.0.1:{port}"},
        logging={"format": "json", "level": "info"},
    )
    runner = Runner(pair, cfg, env=notify.env(watchdog_usec=None)).start().ready()
    six = Six(pair, cfg, runner, notify, port)
    pair.pub_exec("INSERT INTO t VALUES (1, 'a')")
    wait_equal(pair, ["t"], runner=runner)

    # Idle and caught up: nothing committed on the source waits to be applied.
    time.sleep(1.0)  # the last commit is a second old: "time since it" would not be 0
    six.skip_to_now()
    idle = six.seconds()
    assert idle == dict.fromkeys(PLACES, 0.0), idle
    # ... and in bytes, once the worker confirmed what the walsender sent it.
    wait_for(lambda: six.status_json()["lag_bytes"] == 0, 30, "status: 0 bytes")
    wait_for(lambda: six.metrics().get("applier_lag_bytes") == 0, 30, "metrics: 0 bytes")

    # A row lock on the target holds the apply of a change the source committed.
    with pair.sub_conn(autocommit=False) as locker:
        locker.execute("SELECT * FROM t WHERE id = 1 FOR UPDATE")
        pair.pub_exec("UPDATE t SET v = 'b' WHERE id = 1")
        wait_for(lambda: pair.sub_exec(_WAITING)[0][0] > 0, 30, "the apply to wait on the lock")
        six.skip_to_now()
        # Each place reports on its own clock (STATUS= every status_interval): wait
        # until every place has seen the wait begin, then that each one grows.
        wait_for(lambda: min(six.seconds(("--timeout", "1")).values()) > 0, 30,
                 "every place to see the lag")  # fmt: skip
        first = six.seconds(("--timeout", "1"))
        second = six.seconds(("--timeout", "1"))
        grew = {p: (first[p], second[p]) for p in PLACES if not second[p] > first[p] > 0}
        assert not grew, f"not growing (first, second): {grew}"
        assert (six.status_json()["lag_bytes"] or 0) > 0
        assert (six.metrics().get("applier_lag_bytes") or 0) > 0
        locker.rollback()

    # The lock gone, the change applied: 0 again everywhere.
    wait_equal(pair, ["t"], runner=runner)
    wait_for(lambda: six.metrics().get("applier_lag_seconds") == 0, 30, "metrics back to 0")
    six.skip_to_now()
    after = six.seconds()
    assert after == dict.fromkeys(PLACES, 0.0), after
    assert runner.stop() == 0

    # No worker: what the source committed since waits, for how long no one measures.
    pair.pub_exec("INSERT INTO t VALUES (2, 'c')")
    st = six.status_json()
    assert st["lag_bytes"] > 0 and st["lag_seconds"] is None, st
    assert "no worker running" in st["lag_note"], st
    assert "no worker running" in _cli(cfg, "status").stdout
