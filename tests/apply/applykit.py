"""Helpers for the apply tests: run `applier run` as a subprocess, wait for convergence."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import Pair

from applier.apply.handlers.dispatch import Applier

ROOT = Path(__file__).resolve().parents[2]


class Runner:
    """`applier run --config F` as a real process (so SIGTERM/SIGKILL are real)."""

    def __init__(
        self,
        pair: Pair,
        config: Path | None,
        log_name: str = "applier.log",
        env: dict[str, str] | None = None,
    ) -> None:
        """``config`` None: no --config (APPLIER_CONFIG in ``env``, or no file at all);
        ``env``: variables added to the process's environment."""
        self.pair = pair
        self.config = config
        self.env = env or {}  # added to the environment (e.g. NOTIFY_SOCKET)
        self.log_path = pair.workdir / log_name
        self.proc: subprocess.Popen[bytes] | None = None
        pair.cleanup.append(self.kill)

    def start(self) -> Runner:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        args = ["--config", str(self.config)] if self.config is not None else []
        self._log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "applier.cli", "run", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )
        return self

    def ready(self, timeout: float = 60) -> Runner:
        """Wait until the worker streams from the slot (changes made after this are seen)."""
        slot = self.pair.slot

        def streaming() -> bool:
            if not self.alive():
                raise AssertionError(f"applier exited early:\n{self.log()[-4000:]}")
            rows = self.pair.pub.execute(
                f"SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'"
            )
            return bool(rows and rows[0][0])

        wait_for(streaming, timeout, "the worker to stream")
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 60) -> int:
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def table_rows(query_fn: Any, table: str, order: str = "1") -> list[str]:
    rows = query_fn(f"SELECT row_to_json(t)::text FROM {table} t ORDER BY {order}")
    return [r[0] for r in rows]


def wait_equal(
    pair: Pair,
    tables: list[str],
    timeout: float = 60,
    runner: Runner | None = None,
    order: str = "1",
) -> None:
    """Poll until every table has the same rows on both sides."""
    deadline = time.monotonic() + timeout
    while True:
        diffs = []
        for t in tables:
            src = table_rows(pair.pub_exec, t, order)
            dst = table_rows(pair.sub_exec, t, order)
            if src != dst:
                diffs.append((t, src[:5], dst[:5], len(src), len(dst)))
        if not diffs:
            return
        if runner is not None and (not runner.alive() or time.monotonic() > deadline):
            # The whole log, for the captured output of the failure report: a loss
            # that does not reproduce must still leave its evidence in CI's output.
            print(f"--- applier log ({runner.log_path}) ---\n{runner.log()}")
        if runner is not None and not runner.alive():
            raise AssertionError(
                f"applier exited {runner.proc and runner.proc.returncode}:\n{runner.log()[-4000:]}"
            )
        if time.monotonic() > deadline:
            log = runner.log()[-4000:] if runner else ""
            raise AssertionError(f"tables differ after {timeout}s: {diffs}\n{log}")
        time.sleep(0.2)


def origin_lsn(pair: Pair, origin: str) -> str | None:
    rows = pair.sub.execute(
        f"SELECT remote_lsn::text FROM pg_replication_origin_status WHERE external_id = '{origin}'"
    )
    return rows[0][0] if rows else None


def wait_for(cond: Any, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def steady_inserts(pair: Pair, table: str = "t", every: float = 0.02) -> Iterator[None]:
    """A writer inserting 1, 2, 3... into ``table`` on the source every ``every`` s
    (about 50 a second) for as long as the block runs: a fault then always meets
    changes in flight."""
    stop = threading.Event()

    def write() -> None:
        with pair.pub_conn(autocommit=True) as conn:
            n = 0
            while not stop.is_set():
                n += 1
                conn.execute(f"INSERT INTO {table} VALUES (%s)", (n,))
                time.sleep(every)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join(10)


@contextlib.contextmanager
def applier_on_target(
    pair: Pair, spool_dir: Path, timeout: float | None = None
) -> Iterator[Applier]:
    """A real Applier and TargetSession on ``pair``'s target, without a worker: the
    origin and applier's target schema made first, everything closed after."""
    from applier.apply.handlers.spool import SpoolSet
    from applier.apply.sql.mapping import Catalog
    from applier.apply.target.origin import ensure_origin
    from applier.apply.target.session import TargetSession
    from applier.lsn import Lsn
    from applier.schema import upgrade_target

    cfg = pair.config()
    conn = pair.sub_conn(autocommit=True)
    ensure_origin(conn, cfg.origin)
    upgrade_target(pair.sub_dsn)  # the origin stamp's tables
    extra = {} if timeout is None else {"timeout": timeout}
    session = TargetSession(pair.sub_dsn, cfg.origin, "on", **extra)
    a = Applier(cfg, session, Catalog(conn), SpoolSet(spool_dir, "a", 1 << 20), Lsn(0))
    try:
        yield a
    finally:
        a.abandon()
        session.close()
        conn.close()
