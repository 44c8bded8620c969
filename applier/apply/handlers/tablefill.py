"""Tables added to the publication, filled without a hand step: ``sync-tables`` as a child.

When a captured ``ALTER PUBLICATION ... ADD TABLE`` names an included table
(:mod:`applier.apply.handlers.ddl`), its changes are held from that point
(:mod:`applier.apply.rules.ddlsync`: its ``applier.table_sync`` row is
``skipped`` with ``lsn`` = the commit LSN of that transaction, which marks it
as held for this fill) and the rows it had before are in no stream:
``applier sync-tables`` copies them under its own snapshot and hands the table
over to this worker (:mod:`applier.synctables`). The worker starts that command
itself, once the target transaction that ran the statements around it has
committed (a ``CREATE TABLE`` replayed in it must be visible to the copy):
``python -m applier.cli sync-tables --config F --quiet --tables T``, its output
going where the worker's goes (its log). The worker does not wait for it: it
goes on applying everything else, and answers its handover as for a
sync-tables started by hand.

Nothing is lost between that commit and the child: the row says what is owed.
At start and every :data:`RESCAN` seconds the worker reads the rows held for a
fill whose transaction the origin has passed (a worker stopped or killed before
it started the child, or a request this session has not reached yet) and starts
one child for all of them. One at a time: sync-tables runs once per origin (an
advisory lock), so a second would fail. A child that fails (its own output in
the log says why; the warning gives its exit code and when it is tried again)
is started again for the same tables after :data:`RETRY_FIRST` seconds,
doubled at each failure up to :data:`RETRY_MAX`; ``applier status`` shows the
table waiting for sync-tables meanwhile. Children are not stopped with the
worker: sync-tables resumes where it stopped, and waits for a worker to hand
over to (a child left copying by a worker that is gone is not started again
here: its row is no longer ``skipped``; rerun the command by hand if it died).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from typing import Protocol

from applier.apply.rules.tablesync import Name, TableSyncs
from applier.config import Config
from applier.lsn import Lsn
from applier.origingroup import progress_sql

log = logging.getLogger("applier.apply")

#: Seconds between two reads of the tables held for a fill.
RESCAN = 10.0
#: A failed child's tables are tried again after this many seconds, doubled per failure...
RETRY_FIRST = 5.0
#: ... up to this.
RETRY_MAX = 300.0

#: Held for a fill (ddlsync's hold: ``lsn`` set), the adding transaction applied here.
_HELD = """
SELECT schema_name, table_name FROM applier.table_sync
 WHERE origin = %s AND state = 'skipped' AND lsn IS NOT NULL
   AND lsn < """ + progress_sql()
_UNFINISHED = (
    "SELECT schema_name, table_name FROM applier.table_sync "
    "WHERE origin = %s AND state NOT IN ('syncdone', 'ready')"
)


class FillHost(Protocol):
    @property
    def syncs(self) -> TableSyncs: ...


class TableFill:
    """Sync requests waiting for their commit, and the child started for them."""

    def __init__(self, cfg: Config, host: FillHost | None = None) -> None:
        self.cfg = cfg
        self.host = host
        #: (commit LSN of the transaction that added them, tables) waiting for it.
        self.waiting: list[tuple[Lsn, tuple[Name, ...]]] = []
        self.child: tuple[subprocess.Popen[bytes], tuple[Name, ...]] | None = None
        self.started = 0
        #: Consecutive failed children, the tables of the last, and when to try again.
        self.failures = 0
        self.retry: tuple[Name, ...] = ()
        self.retry_at = 0.0
        self._scanned = float("-inf")

    def request(self, tables: tuple[Name, ...], commit_lsn: Lsn) -> None:
        """Copy ``tables`` once the transaction at ``commit_lsn`` committed here."""
        if all((commit_lsn, tables) != w for w in self.waiting):
            self.waiting.append((commit_lsn, tables))

    def tick(self, committed: Lsn, now: float | None = None) -> None:
        """Report the child that ended; start one for what is owed (``committed``: the
        origin's position as of the last commit known)."""
        now = time.monotonic() if now is None else now
        self._reap(now)
        if self.child is not None or now < self.retry_at:
            return
        due = {t for lsn, tables in self.waiting if lsn < committed for t in tables}
        if not due and not self.retry and now - self._scanned < RESCAN:
            return
        self._scanned = now
        self.waiting = [w for w in self.waiting if w[0] >= committed]
        owed = due | self._held() | self._unfinished(self.retry)
        self.retry = ()
        if owed:
            self._start(tuple(sorted(owed)))

    def _rows(self, query: str, *args: str) -> set[Name]:
        conn = self.host.syncs.conn if self.host is not None else None
        if conn is None:
            return set()
        return {(str(r[0]), str(r[1])) for r in conn.execute(query, args).fetchall()}

    def _held(self) -> set[Name]:
        return self._rows(_HELD, self.cfg.origin, self.cfg.origin)

    def _unfinished(self, tables: tuple[Name, ...]) -> set[Name]:
        if not tables:
            return set()
        return self._rows(_UNFINISHED, self.cfg.origin) & set(tables)

    def _reap(self, now: float) -> None:
        if self.child is None:
            return
        child, tables = self.child
        code = child.poll()
        if code is None:
            return
        self.child = None
        what = _names(tables)
        if code == 0:
            self.failures = 0
            log.info("sync-tables done", extra={"ctx": {"tables": what}})
            return
        self.failures += 1
        wait = min(RETRY_MAX, RETRY_FIRST * 2 ** (self.failures - 1))
        self.retry, self.retry_at = tables, now + wait
        log.warning(
            "sync-tables exited %s (its output above says why): the tables stay held; "
            "it is started again in %.0f s, or run it by hand: %s",
            code,
            wait,
            self.command(what),
            extra={"ctx": {"tables": what, "failures": self.failures}},
        )

    def command(self, tables: str) -> str:
        return f"applier sync-tables --config {self.cfg.path or 'F'} --tables {tables}"

    def _start(self, tables: tuple[Name, ...]) -> None:
        args = [sys.executable, "-m", "applier.cli", "sync-tables", "--quiet"]
        if self.cfg.path is not None:
            args += ["--config", str(self.cfg.path)]
        for s, n in tables:
            args += ["--tables", f"{s}.{n}"]
        what = _names(tables)
        try:
            child = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        except OSError as e:
            self.failures += 1
            self.retry = tables
            self.retry_at = time.monotonic() + min(RETRY_MAX, RETRY_FIRST * 2**self.failures)
            log.warning("could not start sync-tables (%s): tried again later, or run it "
                        "by hand: %s", e, self.command(what))  # fmt: skip
            return
        self.child = (child, tables)
        self.started += 1
        log.info(
            "table added to the publication: sync-tables started to copy it",
            extra={"ctx": {"tables": what, "pid": child.pid}},
        )


def _names(tables: tuple[Name, ...]) -> str:
    return " ".join(f"{s}.{n}" for s, n in tables)
