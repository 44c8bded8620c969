"""What one Spark task runs: copy one slice of one table, exactly once.

A task opens its own connections (psycopg, nothing shared with the driver):

* source: ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION
  SNAPSHOT '<exported>'`` so every slice of every table reads the same
  snapshot, the one the slot's consistent point belongs to;
* target: one transaction that takes an advisory lock on the slice, checks
  the slice's done-record, streams ``COPY (SELECT cols FROM t WHERE slice) TO
  STDOUT`` block by block into ``COPY t (cols) FROM STDIN``, inserts the
  done-record and commits. Data and record commit together or not at all, so
  a Spark retry (or a speculative duplicate) of a finished slice skips it, and
  a task killed mid-copy leaves nothing behind.

Bytes go from one socket to the other as the server produced them (binary
format when every column has the same type name on both sides, text
otherwise); no row is ever materialised in Python or in the JVM.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..errors import BootstrapError

#: Sessions of copy tasks on the target: no trigger or FK check fires for
#: copied rows (they were checked on the source), and commits need not wait
#: for a flush (a crash loses the slice and its done-record together).
_TARGET_SETTINGS = ("SET synchronous_commit = off",)


@dataclass(frozen=True)
class SliceTask:
    """Everything a task needs, picklable (it travels to the Spark workers)."""

    source_conninfo: str
    target_conninfo: str
    snapshot: str
    slot: str
    run_id: int
    src_schema: str
    src_name: str
    dst_schema: str
    dst_name: str
    columns: tuple[str, ...]
    binary: bool
    slice_no: int
    where: str | None

    @property
    def label(self) -> str:
        return f"{self.src_schema}.{self.src_name}#{self.slice_no}"


@dataclass(frozen=True)
class SliceResult:
    src_schema: str
    src_name: str
    slice_no: int
    rows: int
    bytes: int
    seconds: float
    skipped: bool


def copy_out_sql(task: SliceTask) -> sql.Composed:
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in task.columns)
    where = sql.SQL(" WHERE " + task.where) if task.where else sql.SQL("")
    return sql.SQL("COPY (SELECT {} FROM {}{}) TO STDOUT{}").format(
        cols, sql.Identifier(task.src_schema, task.src_name), where, _fmt(task.binary)
    )


def copy_in_sql(task: SliceTask) -> sql.Composed:
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in task.columns)
    return sql.SQL("COPY {} ({}) FROM STDIN{}").format(
        sql.Identifier(task.dst_schema, task.dst_name), cols, _fmt(task.binary)
    )


def _fmt(binary: bool) -> sql.SQL:
    return sql.SQL(" (FORMAT binary)" if binary else "")


def copy_slice(task: SliceTask) -> SliceResult:
    """Copy one slice unless it is recorded done; raise BootstrapError on failure."""
    try:
        return _copy_slice(task)
    except psycopg.Error as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BootstrapError(f"copying slice {task.label} failed: {msg}") from None


def _copy_slice(task: SliceTask) -> SliceResult:
    start = time.monotonic()
    with psycopg.connect(
        task.target_conninfo, autocommit=True, application_name="applier-bootstrap"
    ) as tgt:
        for stmt in _TARGET_SETTINGS:
            tgt.execute(stmt)
        _try_replica_role(tgt)
        with tgt.transaction():
            tgt.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))",
                (f"applier-bootstrap:{task.slot}:{task.run_id}:{task.label}",),
            )
            if _is_done(tgt, task):
                return SliceResult(task.src_schema, task.src_name, task.slice_no, 0, 0, 0.0, True)
            rows, nbytes = _stream(task, tgt)
            seconds = time.monotonic() - start
            tgt.execute(
                "INSERT INTO applier.bootstrap_slice "
                "(slot, run_id, src_schema, src_name, slice_no, rows, bytes, seconds) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (task.slot, task.run_id, task.src_schema, task.src_name, task.slice_no,
                 rows, nbytes, seconds),
            )  # fmt: skip
    return SliceResult(task.src_schema, task.src_name, task.slice_no, rows, nbytes, seconds, False)


def _try_replica_role(tgt: psycopg.Connection[Any]) -> None:
    # Needs superuser (or the privilege on PG15+); without it triggers fire,
    # which is slower but not wrong for a copy into tables without rows.
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        tgt.execute("SET session_replication_role = replica")


def _is_done(tgt: psycopg.Connection[Any], task: SliceTask) -> bool:
    row = tgt.execute(
        "SELECT 1 FROM applier.bootstrap_slice WHERE slot = %s AND run_id = %s "
        "AND src_schema = %s AND src_name = %s AND slice_no = %s",
        (task.slot, task.run_id, task.src_schema, task.src_name, task.slice_no),
    ).fetchone()
    return row is not None


def _stream(task: SliceTask, tgt: psycopg.Connection[Any]) -> tuple[int, int]:
    """Pipe the slice's COPY OUT into the target's COPY IN; return (rows, bytes)."""
    nbytes = 0
    with psycopg.connect(
        task.source_conninfo, autocommit=True, application_name="applier-bootstrap"
    ) as src:
        src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            src.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(task.snapshot)))
        except psycopg.errors.InvalidParameterValue as e:
            raise BootstrapError(
                f"the exported snapshot {task.snapshot} is gone ({e})",
                hint="the process holding it ended; rerun `applier bootstrap` to start over",
            ) from None
        tcur = tgt.cursor()
        with src.cursor().copy(copy_out_sql(task)) as out, tcur.copy(copy_in_sql(task)) as inp:
            for block in out:
                nbytes += len(block)
                inp.write(block)
        src.execute("ROLLBACK")
    return max(tcur.rowcount, 0), nbytes
