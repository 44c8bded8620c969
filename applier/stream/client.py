"""The logical replication stream: START_REPLICATION, messages in, feedback out.

Design
======

**Never block inside libpq.** The psycopg binary build holds the GIL while a
libpq call blocks, so one blocking ``PQgetCopyData`` would freeze every other
thread of the process (the apply worker's committer, the bootstrap's progress
display, signal handling). The connection is put in non-blocking mode; we
wait for the socket with :mod:`selectors` (which releases the GIL) and only
then call ``consume_input`` and ``get_copy_data(async=1)``, which return at
once. Writes (status updates) use ``put_copy_data`` + ``flush`` and wait for
writability the same way.

**LSN tracking and feedback.** Two positions are kept:

* :attr:`LogicalStream.last_received` - the highest ``wal_end`` seen in an
  XLogData or keepalive. It is reported as the *write* position: it tells the
  walsender we have the bytes (and lets a shutting-down walsender finish), but
  it does not advance a logical slot.
* the confirmed position, set only by :meth:`LogicalStream.confirm` - the
  caller's promise that everything up to there is durably applied. It is
  reported as *flush* and *apply*, and only the flush position advances the
  slot's ``confirmed_flush_lsn``. It never moves back, and nothing we merely
  received is ever reported as flushed. With ``report_flush=False``
  (``applier decode``) flush/apply are sent as 0/0 (InvalidXLogRecPtr), which
  the walsender ignores, so the slot never moves.

A status update goes out every ``status_interval`` seconds, at once when a
keepalive asks for a reply, and on :meth:`LogicalStream.send_status`.

**Liveness.** An idle walsender sends keepalives only when *our* replies are
overdue, and we reply regularly, so an idle healthy server may say nothing
for a long time. After ``timeout / 2`` seconds of silence we therefore ask
for a reply (status update with ``reply_requested``); if the server stays
silent for ``timeout`` seconds in total, :class:`ServerTimeout` is raised.

**Errors.** A broken socket or a terminated walsender is
:class:`ConnectionLost` (retryable); server errors inside the stream (e.g. a
missing publication, which the walsender reports only when it decodes the
first change) are mapped by :func:`~applier.stream.replconn.map_server_error`;
bad bytes raise :class:`DecodeError` from the protocol core.

Threads: :meth:`read` runs on one thread; :meth:`confirm` and
:meth:`send_status` may be called from any thread (libpq calls are serialised
by a lock that is never held while waiting on the socket).
"""

from __future__ import annotations

import gc
import logging
import selectors
import socket
import threading
import time
from functools import partial
from typing import Any

import psycopg
from psycopg import pq

from applier.errors import ApplierError, ConnectionLost, ProtocolError, ServerTimeout
from applier.lsn import Lsn, now_pg_timestamp
from applier.protocol import (
    Insert,
    InsertRun,
    PgOutputDecoder,
    PgOutputMessage,
    StreamedChange,
    StreamedRun,
    standby_status_update,
)
from applier.stream.negotiate import StreamOptions, negotiate, start_replication_sql
from applier.stream.readahead import ReadAhead
from applier.stream.replconn import ReplicationConnection, map_server_error
from applier.stream.takeloop import TakeLoop
from applier.stream.versions import max_proto_version

__all__ = ["LogicalStream", "StreamOptions", "max_proto_version", "negotiate"]

log = logging.getLogger("applier.stream")

#: How many messages one read() returns at most, so status updates and the
#: liveness check still run while the server sends faster than we consume.
MAX_BATCH = 10_000
#: ... and how many bytes of them, about (one libpq buffer more at most): a
#: batch's messages are all alive until the worker has applied them, so wide
#: rows must not fill it by count (10,000 rows of 1 MB each).
MAX_BATCH_BYTES = 8 * 1024 * 1024

#: Pause the cyclic garbage collector while a batch is received and decoded.
#: Every decoded message allocates four GC-tracked objects (the item tuple, the
#: message, its TupleData and the values tuple) that stay alive in the batch,
#: so with the collector running a batch of 10,000 messages triggers ~60
#: young collections, and their survivors keep triggering *full* collections
#: of the whole heap: measured, that was half of the CPU time of read().
#: Paused, the batch costs one young collection when the collector is turned
#: back on (the allocation count is kept). The pause lasts only while libpq
#: has data buffered, never while waiting on the socket; the collector is
#: re-enabled only if it was enabled before (so a caller's gc.disable() holds).
PAUSE_GC = True

#: How long stop() waits for the server to end the COPY before just closing.
STOP_DRAIN_SECONDS = 5.0


class LogicalStream:
    """START_REPLICATION on a :class:`ReplicationConnection`; read messages, report progress."""

    def __init__(self, conn: ReplicationConnection, options: StreamOptions) -> None:
        self.conn = conn
        self.options = options
        neg = negotiate(conn.server_version, options)
        self.negotiated = neg
        self.proto_version: int = neg.proto_version
        self.streaming: str = neg.streaming
        self.two_phase: bool = neg.two_phase
        self.decoder = PgOutputDecoder(
            neg.proto_version,
            streaming_parallel=neg.streaming == "parallel",
            defer_streamed=options.defer_streamed,
        )
        self.last_received: Lsn = Lsn(0)
        self._confirmed = Lsn(0)
        self._confirm_lock = threading.Lock()
        self._io = threading.RLock()  # serialises libpq calls; never held while waiting
        self._pgconn = conn.conn.pgconn
        #: What read_ahead() took while the worker waited on the target.
        self.ahead = ReadAhead(self._pgconn)
        #: libpq's next CopyData without waiting, as the read loop calls it.
        self._get = partial(self._pgconn.get_copy_data, 1)
        self._sel: selectors.BaseSelector | None = None
        #: Readable when read() should return at once (see wake_on).
        self._wakeup: socket.socket | None = None
        self._started = False
        self._stopped = False
        self._last_heard = 0.0
        self._last_status = 0.0
        self._ping_at = 0.0  # when we last asked for a reply; 0: no ask outstanding
        #: The send_time of the last XLogData received: the server's clock (microseconds
        #: since 2000-01-01), as the commit timestamps are, so their difference says how
        #: far behind the walsender is, whatever the two hosts' clocks say.
        self.last_send_time = 0
        #: Counters (for logs and benchmarks).
        self.messages_received = 0
        self.bytes_received = 0
        self.keepalives_received = 0
        self.status_updates_sent = 0
        #: What take_xlog makes runs of streamed changes and of Inserts into, or None.
        group = (
            (StreamedChange, StreamedRun, Insert, InsertRun)
            if options.defer_streamed and options.group_streamed
            else None
        )
        #: The read loop (applier.stream.takeloop): it records what it took here.
        self.taker = TakeLoop(self, self._get, self.ahead, group)

    # -- starting -------------------------------------------------------------------

    def start(self) -> None:
        """Send START_REPLICATION and wait (on the socket) until the COPY BOTH starts."""
        if self._started:
            raise ProtocolError("LogicalStream.start() called twice")
        sql = start_replication_sql(
            self.options.slot, self.options.start_lsn, self.negotiated.options
        )
        log.debug("starting replication", extra={"ctx": {"command": sql}})
        pgconn = self._pgconn
        try:
            pgconn.nonblocking = 1
            pgconn.send_query(sql.encode())
            self._flush_output()
        except psycopg.OperationalError as e:
            raise self._lost(e) from None
        self._sel = selectors.DefaultSelector()
        self._sel.register(pgconn.socket, selectors.EVENT_READ)
        self._wait_copy_both()
        if self._wakeup is not None:
            self._sel.register(self._wakeup, selectors.EVENT_READ)
        now = time.monotonic()
        self._started = True
        self._last_heard = self._last_status = now
        log.info(
            "replication started",
            extra={
                "ctx": {
                    "slot": self.options.slot,
                    "start_lsn": Lsn(self.options.start_lsn),
                    "proto_version": self.proto_version,
                    "streaming": self.streaming,
                    "two_phase": self.two_phase,
                }
            },
        )

    def _wait_copy_both(self) -> None:
        deadline = time.monotonic() + self.options.timeout
        assert self._sel is not None
        while True:
            with self._io:
                try:
                    self._pgconn.consume_input()
                    while not self._pgconn.is_busy():
                        res = self._pgconn.get_result()
                        if res is None:
                            raise ProtocolError("START_REPLICATION ended without starting a stream")
                        if res.status == pq.ExecStatus.COPY_BOTH:
                            return
                        if res.status == pq.ExecStatus.FATAL_ERROR:
                            raise self._result_error(res, "START_REPLICATION")
                except psycopg.OperationalError as e:
                    raise self._lost(e) from None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerTimeout(
                    f"START_REPLICATION got no answer in {self.options.timeout:g}s",
                    hint="check the source server's load and logs",
                )
            self._sel.select(remaining)

    # -- reading --------------------------------------------------------------------

    def read(self, timeout: float) -> list[tuple[Lsn, PgOutputMessage | StreamedRun | InsertRun]]:
        """Wait at most ``timeout`` s, then return every message available (maybe none).

        Each item is ``(wal_start, message)``. Keepalives are handled here and
        not returned; status updates are sent when due.
        """
        out: list[tuple[Lsn, PgOutputMessage | StreamedRun | InsertRun]] = []
        self._read(timeout, out, self.decoder)
        return out

    def read_raw(self, timeout: float) -> list[tuple[Lsn, memoryview]]:
        """Like :meth:`read` but return the undecoded pgoutput payloads (recording, benchmarks)."""
        out: list[tuple[Lsn, memoryview]] = []
        self._read(timeout, out, None)
        return out

    def wake_on(self, sock: socket.socket) -> None:
        """Let ``sock`` becoming readable end a wait of :meth:`read` at once.

        The worker passes the socket its signal handlers write to
        (``signal.set_wakeup_fd``): SIGTERM and SIGHUP are then served when they
        come, not when the read's timeout ends. Call before :meth:`start`.
        """
        self._wakeup = sock

    def _read(self, timeout: float, out: list[Any], decoder: PgOutputDecoder | None) -> None:
        if not self._started or self._stopped:
            raise ProtocolError("LogicalStream.read() needs a started, not stopped stream")
        assert self._sel is not None
        deadline = time.monotonic() + timeout
        while True:
            self._drain(out, decoder)
            now = time.monotonic()
            self._housekeeping(now)
            remaining = deadline - now
            if out or remaining <= 0:
                return
            for key, _ in self._sel.select(min(remaining, self._next_due(now) - now)):
                if key.fileobj is self._wakeup:
                    _empty(self._wakeup)
                    return

    def _drain(self, out: list[Any], decoder: PgOutputDecoder | None) -> None:
        """Read (and decode) everything libpq can give without blocking, up to
        MAX_BATCH messages or MAX_BATCH_BYTES.

        The cyclic garbage collector is paused meanwhile (see :data:`PAUSE_GC`).
        """
        pgconn = self._pgconn
        pause = PAUSE_GC and gc.isenabled()
        with self._io:
            if pause:
                gc.disable()
            try:
                until = self.bytes_received + MAX_BATCH_BYTES
                while len(out) < MAX_BATCH and self.bytes_received < until:
                    pgconn.consume_input()
                    if not self.taker.take_buffered(out, decoder, MAX_BATCH):
                        return
            except psycopg.OperationalError as e:
                raise self._lost(e) from None
            finally:
                if pause:
                    gc.enable()

    def read_ahead(self) -> bool:
        """Take what the walsender sent into memory (applier.stream.readahead) while
        the worker waits on the target; whether there is room for more."""
        with self._io:
            return self.ahead.fill()

    def heard(self) -> None:
        """The walsender was heard from just now: no reply to a ping is owed."""
        self._last_heard = time.monotonic()
        self._ping_at = 0.0

    @property
    def socket(self) -> int:
        """The replication connection's socket (to wait on it with others)."""
        return int(self._pgconn.socket)

    @property
    def is_streaming(self) -> bool:
        """Started and not stopped: the slot is being streamed (``applier_up``)."""
        return self._started and not self._stopped

    # -- feedback -------------------------------------------------------------------

    def confirm(self, flush_lsn: Lsn) -> None:
        """Record that everything up to ``flush_lsn`` is durably applied (never moves back)."""
        with self._confirm_lock:
            if flush_lsn > self._confirmed:
                self._confirmed = Lsn(flush_lsn)

    @property
    def confirmed(self) -> Lsn:
        return self._confirmed

    def send_status(self, reply_requested: bool = False) -> None:
        """Send a standby status update now (write=last received, flush=apply=confirmed)."""
        if not self._started or self._stopped:
            return
        with self._io:
            try:
                self.send_status_locked(reply_requested)
            except psycopg.OperationalError as e:
                raise self._lost(e) from None

    def send_status_locked(self, reply_requested: bool) -> None:
        """Send a standby status update; the caller holds libpq's lock."""
        flush = self._confirmed if self.options.report_flush else Lsn(0)
        write = max(self.last_received, flush)
        msg = standby_status_update(write, flush, flush, now_pg_timestamp(), reply_requested)
        while self._pgconn.put_copy_data(msg) == 0:  # non-blocking: libpq's buffer is full
            self._flush_output()
        self._flush_output()
        self._last_status = time.monotonic()
        self.status_updates_sent += 1

    def _flush_output(self) -> None:
        """Push libpq's output buffer to the socket, waiting for writability (not in libpq)."""
        deadline = time.monotonic() + self.options.timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._pgconn.socket, selectors.EVENT_READ | selectors.EVENT_WRITE)
            while self._pgconn.flush() == 1:  # 1: data left; libpq reads input meanwhile
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timeout("could not send to the source")
                sel.select(remaining)

    def _housekeeping(self, now: float) -> None:
        """Periodic status update, ping after half the timeout, timeout check."""
        silent = now - self._last_heard
        if silent >= self.options.timeout:
            raise self._timeout("the source sent nothing")
        ping = silent >= self.options.timeout / 2 and not self._ping_at
        if ping or now - self._last_status >= self.options.status_interval:
            with self._io:
                try:
                    self.send_status_locked(reply_requested=ping)
                except psycopg.OperationalError as e:
                    raise self._lost(e) from None
            if ping:
                self._ping_at = now

    def _next_due(self, now: float) -> float:
        """The next moment housekeeping has something to do."""
        due = min(
            self._last_status + self.options.status_interval,
            self._last_heard + self.options.timeout,
        )
        if not self._ping_at:
            due = min(due, self._last_heard + self.options.timeout / 2)
        return max(due, now + 0.001)

    # -- errors ---------------------------------------------------------------------

    def _timeout(self, what: str) -> ServerTimeout:
        silent = time.monotonic() - self._last_heard
        return ServerTimeout(
            f"{what} for {silent:.1f}s (timeout {self.options.timeout:g}s)",
            hint="the source server or its walsender is stuck or unreachable; check it "
            "(pg_stat_replication, its log); applier run reconnects",
            slot=self.options.slot,
            last_received=self.last_received,
        )

    def _lost(self, exc: BaseException) -> ConnectionLost:
        self.ahead.stopped = True  # nothing more to take from this connection
        detail = str(exc).strip().replace("\n", " ")
        return ConnectionLost(
            f"lost the replication connection to the source: {detail}",
            hint="the walsender was terminated, or the source server restarted, crashed or "
            "became unreachable; applier run reconnects and resumes from its last committed "
            "position",
            slot=self.options.slot,
            last_received=self.last_received,
        )

    def _result_error(self, res: pq.abc.PGresult, where: str) -> ApplierError:
        sqlstate = res.error_field(pq.DiagnosticField.SQLSTATE)
        primary = res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)
        state = sqlstate.decode("ascii", "replace") if sqlstate else None
        message = (primary or res.error_message).decode("utf-8", "replace").strip()
        if state == "57P01":
            return ConnectionLost(
                f"{where}: the walsender was terminated on the source: {message}",
                hint="someone ran pg_terminate_backend() on it or the server is shutting "
                "down; applier run reconnects and resumes",
                sqlstate=state,
                slot=self.options.slot,
            )
        err = map_server_error(state, message, slot=self.options.slot, where=where)
        err.context.setdefault("slot", self.options.slot)
        return err

    def copy_ended(self) -> ApplierError:
        """The server ended the COPY: collect its final result and say why."""
        deadline = time.monotonic() + 2.0
        error: ApplierError | None = None
        while time.monotonic() < deadline:
            try:
                self._pgconn.consume_input()
            except psycopg.OperationalError:
                break
            if self._pgconn.is_busy():
                time.sleep(0.01)
                continue
            res = self._pgconn.get_result()
            if res is None:
                break
            if res.status == pq.ExecStatus.FATAL_ERROR and error is None:
                error = self._result_error(res, "replication stream")
        return error or ConnectionLost(
            "the walsender ended the replication stream (it was terminated, or the source "
            "server is shutting down)",
            hint="applier run reconnects and resumes from its last committed position",
            slot=self.options.slot,
            last_received=self.last_received,
        )

    # -- stopping -------------------------------------------------------------------

    def stop(self) -> None:
        """Final status update, CopyDone, drain the server's end of the COPY, close. Idempotent."""
        if self._stopped:
            return
        self.ahead.stopped = True
        if self._wakeup is not None and self._sel is not None and self._started:
            self._sel.unregister(self._wakeup)  # the drain below waits for the server only
        if self._started and not self.conn.closed:
            try:
                with self._io:
                    self.send_status_locked(reply_requested=False)
                    self._pgconn.put_copy_end()
                    self._flush_output()
                self._drain_to_end()
            except (ApplierError, psycopg.Error) as e:
                log.debug("replication stop: %s", e)
        self._stopped = True
        if self._sel is not None:
            self._sel.close()
        self.conn.close()

    def _drain_to_end(self) -> None:
        """Discard what the server still sends until its CopyDone/CommandComplete."""
        assert self._sel is not None
        deadline = time.monotonic() + STOP_DRAIN_SECONDS
        pgconn = self._pgconn
        while time.monotonic() < deadline:
            with self._io:
                pgconn.consume_input()
                while True:
                    n, _ = pgconn.get_copy_data(1)
                    if n == 0:
                        break
                    if n == -1:
                        self._discard_results(deadline)
                        return
            self._sel.select(max(0.0, min(0.2, deadline - time.monotonic())))

    def _discard_results(self, deadline: float) -> None:
        assert self._sel is not None
        while time.monotonic() < deadline:
            self._pgconn.consume_input()
            if self._pgconn.is_busy():
                self._sel.select(max(0.0, min(0.2, deadline - time.monotonic())))
            elif self._pgconn.get_result() is None:
                return


def _empty(sock: socket.socket) -> None:
    """Read what a (non-blocking) wake-up socket holds."""
    try:
        while sock.recv(512):
            pass
    except (BlockingIOError, InterruptedError):
        pass
