"""What people see while the copy runs, and the summary after it.

The driver polls the target's ``applier.bootstrap_slice`` (one row per
finished slice with its rows, bytes and seconds) twice a second: that is the
truth about what is committed, it works with any Spark master, and it costs
one small query. Time left is estimated from bytes copied against the table's
heap size (binary COPY is about the heap's size). ``--quiet`` replaces the
live display with a log line every few seconds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

log = logging.getLogger(__name__)


@dataclass
class TableProgress:
    label: str
    slices: int
    est_bytes: int
    rows: int = 0
    bytes: int = 0
    done_slices: int = 0
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None


class BootstrapProgress:
    """Live per-table progress (rich) or periodic log lines (quiet)."""

    def __init__(self, tables: list[TableProgress], *, quiet: bool) -> None:
        self.tables = {t.label: t for t in tables}
        self.quiet = quiet
        self.start = time.monotonic()
        self._last_log = 0.0
        self.console = Console(stderr=True)
        self._progress: Progress | None = None
        self._ids: dict[str, TaskID] = {}

    def __enter__(self) -> BootstrapProgress:
        if not self.quiet:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[slices]}"),
                TextColumn("{task.fields[rows]:>12,} rows"),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._progress.start()
            for t in self.tables.values():
                self._ids[t.label] = self._progress.add_task(
                    t.label, total=max(t.est_bytes, 1), rows=0, slices=f"0/{t.slices}"
                )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, stats: dict[str, tuple[int, int, int]]) -> None:
        """``stats``: label -> (rows, bytes, slices done), as committed on the target."""
        now = time.monotonic()
        for label, (rows, nbytes, done) in stats.items():
            t = self.tables.get(label)
            if t is None:
                continue
            t.rows, t.bytes, t.done_slices = rows, nbytes, done
            if done >= t.slices and t.finished is None:
                t.finished = now
            self._show(t)
        if self.quiet and now - self._last_log >= 5:
            self._last_log = now
            done = sum(t.done_slices for t in self.tables.values())
            total = sum(t.slices for t in self.tables.values())
            copied = sum(t.bytes for t in self.tables.values())
            log.info(
                "bootstrap copy progress",
                extra={"ctx": {"slices": f"{done}/{total}", "bytes": copied}},
            )

    def _show(self, t: TableProgress) -> None:
        if self._progress is None:
            return
        finished = t.done_slices >= t.slices
        total = t.bytes if finished else max(t.est_bytes, t.bytes + 1)
        self._progress.update(
            self._ids[t.label],
            completed=t.bytes,
            total=max(total, 1),
            rows=t.rows,
            slices=f"{t.done_slices}/{t.slices}",
        )

    def summary(self) -> Table:
        table = Table(title="bootstrap copy")
        for col in ("table", "rows", "bytes", "seconds", "MB/s"):
            table.add_column(col, justify="left" if col == "table" else "right")
        for t in self.tables.values():
            secs = (t.finished or time.monotonic()) - self.start
            rate = t.bytes / 1e6 / secs if secs > 0 else 0.0
            table.add_row(t.label, f"{t.rows:,}", f"{t.bytes:,}", f"{secs:.1f}", f"{rate:.1f}")
        return table

    def print_summary(self) -> None:
        if self.quiet:
            for t in self.tables.values():
                log.info(
                    "table copied",
                    extra={"ctx": {"table": t.label, "rows": t.rows, "bytes": t.bytes}},
                )
        else:
            self.console.print(self.summary())


def poll_stats(tgt: Any, slot: str, run_id: int) -> dict[str, tuple[int, int, int]]:
    rows = tgt.execute(
        "SELECT src_schema, src_name, sum(rows), sum(bytes), count(*) "
        "FROM applier.bootstrap_slice WHERE slot = %s AND run_id = %s GROUP BY 1, 2",
        (slot, run_id),
    ).fetchall()
    return {f"{r[0]}.{r[1]}": (int(r[2]), int(r[3]), int(r[4])) for r in rows}
