"""What one Spark task runs: copy one slice of one table, exactly once.

A task opens its own connections (nothing shared with the driver):

* source: a ``psql`` child (its connection string in ``--dbname`` with the
  secrets taken out, the password in its environment: :mod:`.sessions`)
  runs ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION
  SNAPSHOT '<exported>'; COPY (SELECT cols FROM ONLY t WHERE slice) TO
  STDOUT; COMMIT`` so every slice of every table reads the same snapshot, the
  one the slot's consistent point belongs to, and writes the COPY stream
  into a pipe. ``ONLY``: the rows of a parent's inheritance children are
  copied as the children's own, never into the parent;
* target (psycopg, in the task's process, its session pinned: see
  :mod:`.sessions`): one transaction that takes an
  advisory lock on the slice, checks the slice's done-record, feeds the pipe
  into ``COPY t (cols) FROM STDIN`` in 1 MB blocks, inserts the done-record
  and commits. Data and record commit together or not at all, so a Spark
  retry (or a speculative duplicate) of a finished slice skips it, and a task
  killed mid-copy leaves nothing behind. The COPY is ended only once psql has
  exited 0: a source failure aborts the target transaction.

Bytes go from the source to the target as the server produced them (binary
format when every column has the same type name on both sides, text
otherwise; text in the pinned formats, UTF8 on both ends, so neither side's
defaults change a value); no row is ever materialised in Python or in the JVM, and Python
handles a block per call, not a row (libpq's COPY OUT hands out one row per
call, which made a Python loop over it the bottleneck).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from .. import pgconn
from ..errors import BootstrapError
from .clients import program
from .sessions import child_connection

#: Sessions of copy tasks on the target: no trigger or FK check fires for
#: copied rows (they were checked on the source), and commits need not wait
#: for a flush (a crash loses the slice and its done-record together).
_TARGET_SETTINGS = ("SET synchronous_commit = off",)

#: Bytes read from the source pipe per Python call (psycopg hands the target
#: 128 kB per libpq call). 1 MB: a few thousand calls per GB.
_BLOCK = 1 << 20

#: psql writes its stdout in blocks of this size (``stdbuf -o``, where
#: coreutils has it), and the pipe holds as much (``F_SETPIPE_SZ``, Linux):
#: by default psql's stdio writes 4 kB at a time and the reader wakes up
#: for each, 50 kB on average. Measured on a 400 MB slice: reads 7,100 ->
#: 375, CPU of the task 0.50 s -> 0.17 s and of psql 0.43 s -> 0.33 s.
_PIPE_BYTES = 1 << 20


@dataclass(frozen=True)
class SliceTask:
    """Everything a task needs, picklable (it travels to the Spark workers).

    The DSNs may hold passwords: they travel inside the pickled task (Spark's
    RPC, never a command line or SparkConf) and are left out of ``repr``.
    """

    source_conninfo: str = field(repr=False)
    target_conninfo: str = field(repr=False)
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
    #: Tasks of this run copying at once, at most (None: no cap beyond Spark's).
    parallelism: int | None = None
    #: The source's server_version (its child pins what that version has: pgconn)
    #: and ``[bootstrap] client_bin_dir``: the task picks its psql by them on its
    #: own machine (:func:`.clients.pick`).
    source_version: int | None = None
    client_bin_dir: str | None = None

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
    return sql.SQL("COPY (SELECT {} FROM ONLY {}{}) TO STDOUT{}").format(
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
    with pgconn.connect(task.target_conninfo, side="target", purpose="applier-bootstrap") as tgt:
        for stmt in _TARGET_SETTINGS:
            tgt.execute(stmt)
        _try_replica_role(tgt)
        _take_permit(tgt, task)
        start = time.monotonic()
        with tgt.transaction():
            tgt.execute(
                "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext(%s))",
                (f"applier-bootstrap:{task.slot}:{task.run_id}:{task.label}",),
            )
            if _is_done(tgt, task):
                return SliceResult(task.src_schema, task.src_name, task.slice_no, 0, 0, 0.0, True)
            rows, nbytes = _stream(task, tgt)
            seconds = time.monotonic() - start
            tgt.execute(
                "INSERT INTO applier.bootstrap_slice "
                "(slot, run_id, src_schema, src_name, slice_no, rows, bytes, seconds, done_at) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, pg_catalog.clock_timestamp())",
                (task.slot, task.run_id, task.src_schema, task.src_name, task.slice_no,
                 rows, nbytes, seconds),
            )  # fmt: skip
    return SliceResult(task.src_schema, task.src_name, task.slice_no, rows, nbytes, seconds, False)


#: Seconds between two tries for a copy permit.
_PERMIT_POLL = 0.2


def _take_permit(tgt: psycopg.Connection[Any], task: SliceTask) -> None:
    """Wait until fewer than ``task.parallelism`` tasks of this run are copying.

    Spark runs as many tasks as it has slots; ``[bootstrap] parallelism``
    caps the copies at once on any master, local or a cluster, with N
    permits: session advisory locks (run key, 0..N-1) on the target. A
    permit goes back when the task's connection closes, however the task
    ends, so a killed task never keeps one.
    """
    if task.parallelism is None:
        return
    key = f"applier-bootstrap-permits:{task.slot}:{task.run_id}"
    while True:
        row = tgt.execute(
            "SELECT i FROM pg_catalog.generate_series(0, %s - 1) i "
            "WHERE pg_catalog.pg_try_advisory_lock(pg_catalog.hashtext(%s), i) LIMIT 1",
            (task.parallelism, key),
        ).fetchone()
        if row is not None:
            return
        time.sleep(_PERMIT_POLL)


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


@contextlib.contextmanager
def source_command(task: SliceTask) -> Iterator[tuple[list[str], dict[str, str]]]:
    """argv and environment of the psql child that streams the slice out of the source.

    argv is readable by every local user through ``ps``/``/proc``: it holds
    the connection string without its secrets (:func:`.sessions.child_connection`
    puts those in the environment) and SQL made of identifiers, integers and
    the snapshot name. Keep the block open until the child has started.
    """
    set_snapshot = sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(task.snapshot))
    conninfo = pgconn.pinned_conninfo(
        task.source_conninfo, "source", server_version=task.source_version
    )
    with child_connection(conninfo) as child:
        argv = [
            *_buffered_stdout(),
            program("psql", conninfo, (task.source_version or 0) // 10000, task.client_bin_dir),
            "-X", "-q", "-v", "ON_ERROR_STOP=1",
            f"--dbname={child.dbname}",
            "-c", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            "-c", set_snapshot.as_string(None),
            "-c", copy_out_sql(task).as_string(None),
            "-c", "COMMIT",
        ]  # fmt: skip
        env = child.env
        env.setdefault("PGAPPNAME", "applier-bootstrap")
        # -X: no .psqlrc can add output to the data stream.
        yield argv, env


def _buffered_stdout() -> list[str]:
    stdbuf = shutil.which("stdbuf")
    return [stdbuf, "-o", str(_PIPE_BYTES)] if stdbuf else []


def _widen(pipe_fd: int) -> None:
    # Best effort: unprivileged processes may go up to /proc/sys/fs/pipe-max-size.
    with contextlib.suppress(AttributeError, OSError):
        fcntl.fcntl(pipe_fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)


def _stream(task: SliceTask, tgt: psycopg.Connection[Any]) -> tuple[int, int]:
    """Pipe the slice's COPY OUT into the target's COPY IN; return (rows, bytes).

    A psql child runs the COPY OUT under the snapshot and writes it to a pipe;
    this process reads the pipe in blocks of ``_BLOCK`` bytes and hands each
    to the target COPY as it is. Python is in the data path once per block,
    not once per row (libpq's COPY OUT returns one row per call, and
    psycopg's iteration yields them one by one: that was most of the cost).
    """
    nbytes = 0
    # The command's block spans the copy: a secrets file it made must outlive psql's start.
    with tempfile.TemporaryFile() as errf, source_command(task) as (argv, env):
        rfd, wfd = os.pipe()
        _widen(wfd)
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=wfd, stderr=errf, env=env, close_fds=True
            )
        finally:
            os.close(wfd)
        try:
            tcur = tgt.cursor()
            with tcur.copy(copy_in_sql(task)) as inp:
                while block := os.read(rfd, _BLOCK):
                    nbytes += len(block)
                    inp.write(block)
                # EOF: before ending the COPY (which would commit a short
                # slice) make sure the source side finished well.
                if proc.wait() != 0:
                    raise _source_failed(task, errf)
        finally:
            os.close(rfd)
            if proc.poll() is None:  # target failed mid-copy: stop the reader
                proc.kill()
                proc.wait()
    return max(tcur.rowcount, 0), nbytes


def _source_failed(task: SliceTask, errf: Any) -> BootstrapError:
    errf.seek(0)
    text = errf.read().decode("utf-8", "replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = next((ln for ln in lines if "ERROR:" in ln or "FATAL:" in ln), None)
    first = first or (lines[0] if lines else "psql ended without a message")
    msg = re.sub(r"^(?:psql:[^:]*:\d+:\s*)?(?:ERROR|FATAL):\s*", "", first)
    if "invalid snapshot identifier" in msg:
        return BootstrapError(
            f"the exported snapshot {task.snapshot} is gone ({msg})",
            hint="the process holding it ended; rerun `applier bootstrap` to start over",
        )
    return BootstrapError(f"copying slice {task.label} failed on the source: {msg}")
