"""Tables added to the publication, filled without a hand step: ``sync-tables`` as a child.

When a captured ``ALTER PUBLICATION ... ADD TABLE`` names an included table
(:mod:`applier.apply.handlers.ddl`), its changes are held from that point
(:mod:`applier.apply.rules.ddlsync`) and the rows it had before are in no
stream: ``applier sync-tables`` copies them under its own snapshot and hands
the table over to this worker (:mod:`applier.synctables`). The worker starts
that command itself, once the target transaction that ran the statements
around it has committed (a ``CREATE TABLE`` replayed in it must be visible to
the copy): ``python -m applier.cli sync-tables --config F --quiet --tables T``,
its output going where the worker's goes (its log). The worker does not wait
for it: it goes on applying everything else, and answers its handover as for
a sync-tables started by hand.

A child that fails (exit code logged as a warning) leaves the table held (its
``applier.table_sync`` row says so, and ``applier status`` shows it): rerun
the command the warning names. So does a worker that stops between the
commit and the start of the child. Children are not stopped with the worker:
sync-tables resumes where it stopped, and waits for a worker to hand over to.
"""

from __future__ import annotations

import logging
import subprocess
import sys

from applier.config import Config
from applier.lsn import Lsn

log = logging.getLogger("applier.apply")


class TableFill:
    """Sync requests waiting for their commit, and the children started for them."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        #: (commit LSN of the transaction that added them, tables) waiting for it.
        self.waiting: list[tuple[Lsn, tuple[tuple[str, str], ...]]] = []
        self.children: list[tuple[subprocess.Popen[bytes], str]] = []
        self.started = 0

    def request(self, tables: tuple[tuple[str, str], ...], commit_lsn: Lsn) -> None:
        """Copy ``tables`` once the transaction at ``commit_lsn`` committed here."""
        if all((commit_lsn, tables) != w for w in self.waiting):
            self.waiting.append((commit_lsn, tables))

    def tick(self, committed: Lsn) -> None:
        """Start what the target committed (``committed``: the origin's position as of
        the last commit known), and report the children that ended."""
        if self.waiting:
            due = [w for w in self.waiting if w[0] < committed]
            self.waiting = [w for w in self.waiting if w[0] >= committed]
            for _, tables in due:
                self._start(tables)
        for child, what in list(self.children):
            code = child.poll()
            if code is None:
                continue
            self.children.remove((child, what))
            if code == 0:
                log.info("sync-tables done", extra={"ctx": {"tables": what}})
            else:
                log.warning(
                    "sync-tables exited %s: the tables stay held; run it by hand: %s",
                    code,
                    self.command(what),
                    extra={"ctx": {"tables": what}},
                )

    def command(self, tables: str) -> str:
        return f"applier sync-tables --config {self.cfg.path or 'F'} --tables {tables}"

    def _start(self, tables: tuple[tuple[str, str], ...]) -> None:
        names = [f"{s}.{n}" for s, n in tables]
        args = [sys.executable, "-m", "applier.cli", "sync-tables", "--quiet"]
        if self.cfg.path is not None:
            args += ["--config", str(self.cfg.path)]
        for name in names:
            args += ["--tables", name]
        what = " ".join(names)
        try:
            child = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        except OSError as e:
            log.warning("could not start sync-tables (%s): run it by hand: %s", e,
                        self.command(what))  # fmt: skip
            return
        self.children.append((child, what))
        self.started += 1
        log.info(
            "table added to the publication: sync-tables started to copy it",
            extra={"ctx": {"tables": what, "pid": child.pid}},
        )
