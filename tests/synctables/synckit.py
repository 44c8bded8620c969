"""Helpers of the sync-tables tests: a writer on old and new tables, the CLI as a process."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from conftest import Pair

ROOT = Path(__file__).resolve().parents[2]

#: ``a`` replicates from the start; ``t_new`` is added to the publication later.
SCHEMA = "CREATE TABLE a (id int PRIMARY KEY, n int NOT NULL)"
NEW_TABLE = """
CREATE TABLE t_new (id int PRIMARY KEY, n int NOT NULL, v text);
CREATE INDEX t_new_n ON t_new (n);
INSERT INTO t_new SELECT g, 0, md5(g::text) FROM generate_series(1, {rows}) g;
"""


def setup(pair: Pair, rows: int = 20_000) -> None:
    pair.both(SCHEMA)
    pair.pub_exec("INSERT INTO a SELECT g, 0 FROM generate_series(1, 200) g")
    pair.sub_exec("INSERT INTO a SELECT g, 0 FROM generate_series(1, 200) g")
    pair.pub_exec(NEW_TABLE.format(rows=rows))
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE a")


class Writer:
    """Transactions on ``a`` and ``t_new``: increments (a double apply shows), inserts,
    deletes, some transactions touching both tables."""

    def __init__(self, pair: Pair, rows: int) -> None:
        self.pair = pair
        self.rows = rows
        self.stop_event = threading.Event()
        self.txns = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Writer:
        self.thread.start()
        return self

    def _run(self) -> None:
        rnd = random.Random(7)
        next_id = self.rows + 1
        try:
            with psycopg.connect(self.pair.pub_dsn, autocommit=True) as conn:
                while not self.stop_event.is_set():
                    k = rnd.randint(1, self.rows)
                    with conn.transaction():
                        conn.execute("UPDATE a SET n = n + 1 WHERE id = %s", (rnd.randint(1, 200),))
                        if rnd.random() < 0.7:
                            conn.execute("UPDATE t_new SET n = n + 1 WHERE id = %s", (k,))
                        if rnd.random() < 0.3:
                            conn.execute("INSERT INTO t_new VALUES (%s, 0, 'w')", (next_id,))
                            next_id += 1
                        if rnd.random() < 0.1:
                            conn.execute("DELETE FROM t_new WHERE id = %s", (rnd.randint(1, k),))
                    self.txns += 1
                    time.sleep(0.002)
        except BaseException as e:  # reported by stop()
            self.error = e

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)
        if self.error is not None:
            raise self.error


def sync_tables(config: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "applier.cli", "sync-tables", "--config", str(config),
         "--quiet", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def state(pair: Pair, table: str = "t_new") -> tuple[Any, ...] | None:
    rows = pair.sub_exec(
        f"SELECT state, lsn::text, slot FROM applier.table_sync WHERE table_name = '{table}'"
    )
    return rows[0] if rows else None


def wait_state(pair: Pair, states: set[str], proc: Any = None, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        st = state(pair)
        if st is not None and st[0] in states:
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"sync-tables exited {proc.returncode}: {proc.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"state {st} never reached {states}")
        time.sleep(0.05)


def slots(pair: Pair) -> list[str]:
    return [r[0] for r in pair.pub_exec("SELECT slot_name FROM pg_replication_slots")]
