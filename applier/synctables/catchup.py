"""Steps 2 and 3 of :mod:`applier.synctables`: stream the table's slot, then hand over.

:class:`CatchUp` is ``applier run`` (the :class:`~applier.apply.worker.Worker`:
sessions, retries of transient faults, the Applier and its exactly-once origin)
over the table's own config (its slot, its origin ``tag``, ``[tables]`` = the
table). Only its loop differs: between batches, at a transaction boundary with
every commit answered, it runs the sync-tables half of the handshake
(:meth:`CatchUp.step`); it ends when it wrote ``syncdone``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from applier.apply.handlers.dispatch import IDLE, Applier
from applier.apply.rules.tablesync import cas_state, read_states

from .. import pgconn
from ..apply.worker import Worker
from ..config import Config
from ..errors import ApplierError, PermanentError
from ..lsn import Lsn

log = logging.getLogger(__name__)
Conn = psycopg.Connection[Any]
Name = tuple[str, str]

#: Seconds between two looks at the state row (and at the worker's position).
STEP_INTERVAL = 0.1


class HandoverTimeout(ApplierError):
    """The worker did not take the table over in time (exit 1: a rerun continues)."""


class CatchUp(Worker):
    """The table's stream, applied until the worker takes the table over."""

    def __init__(self, cfg: Config, tcfg: Config, name: Name, timeout: float) -> None:
        super().__init__(tcfg)
        from applier.apply.rules.tablesync import TableSyncs

        self.syncs = TableSyncs(tcfg, enabled=False)  # this one applies the table
        self.main = cfg
        self.name = name
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.done = False
        self._src: Conn | None = None
        self._asked = 0.0
        self._said: str | None = None

    def _loop(self, stream: Any, applier: Applier, catalog_conn: Conn) -> None:
        last = 0.0
        while not self.stopping:
            self._serve_signals()
            batch = self._read(stream, applier.dispatch, STEP_INTERVAL)
            if self.stopping:
                break
            self._after_batch(stream, applier, catalog_conn, bool(batch))
            now = time.monotonic()
            if applier.state is not IDLE or applier.txn is not None or now - last < STEP_INTERVAL:
                continue
            last = now
            if self.step(stream, applier, catalog_conn):
                self.done = True
                self.stopping = True
                return
            if now > self.deadline:
                raise HandoverTimeout(
                    f"applier run did not take table {self._qual} over within {self.timeout:.0f} s",
                    table=self._qual,
                    hint="check that `applier run` is running for this origin, then rerun "
                    "sync-tables: it continues from the catch-up",
                )

    @property
    def _qual(self) -> str:
        return f"{self.name[0]}.{self.name[1]}"

    def step(self, stream: Any, applier: Applier, conn: Conn) -> bool:
        """The sync-tables half of the handshake; True once ``syncdone`` is written."""
        origin = self.main.origin
        st = read_states(conn, origin, self.main.source.slot).get(self.name)
        state, lsn = st if st is not None else ("gone", None)
        pos = Lsn(stream.last_received)
        if state == "catchup":
            worker = self._worker_position()
            near = bool(pos) and (worker is None or pos >= worker)
            if near and cas_state(conn, origin, self.name, (state, lsn), ("syncwait", lsn)):
                self._say("caught up with the worker; asking it to take the table over")
            elif not near:
                self._ask_position(stream)
            return False
        if state == "syncwait":
            self._say(
                f"caught up; waiting for `applier run` of origin {self.main.origin!r} to take "
                f"the table over at a transaction boundary (--timeout {self.timeout:.0f} s)"
            )
            return False
        if state == "handover":
            assert lsn is not None
            if pos >= lsn:
                applier.session.settle()  # every commit of ours answered before syncdone
                if cas_state(conn, origin, self.name, (state, lsn), ("syncdone", pos)):
                    log.info(
                        "table handed over to applier run",
                        extra={"ctx": {"table": self._qual, "worker_lsn": lsn, "cut": pos}},
                    )
                    return True
            else:
                self._ask_position(stream)
            return False
        if state in ("syncdone", "ready"):
            return True
        raise PermanentError(
            f"the sync state of table {self._qual} changed to {state!r} while it was caught up",
            table=self._qual,
            hint="another sync-tables may run for this table; rerun sync-tables",
        )

    def _ask_position(self, stream: Any) -> None:
        """An idle walsender says how far it has read (a keepalive) only when asked."""
        if time.monotonic() - self._asked >= STEP_INTERVAL:
            self._asked = time.monotonic()
            stream.send_status(reply_requested=True)

    def _say(self, what: str) -> None:
        if self._said != what:
            self._said = what
            log.info(what, extra={"ctx": {"table": self._qual}})

    def _worker_position(self) -> Lsn | None:
        """The worker's slot's confirmed position on the source (None: no such slot)."""
        if self._src is None:
            self._src = pgconn.connect(
                self.main.source.conninfo(), side="source", purpose="applier-sync-tables"
            )
        row = self._src.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_catalog.pg_replication_slots "
            "WHERE slot_name = %s",
            (self.main.source.slot,),
        ).fetchone()
        return Lsn.parse(row[0]) if row and row[0] else None

    def close(self) -> None:
        if self._src is not None:
            self._src.close()
            self._src = None


def catch_up(cfg: Config, tcfg: Config, name: Name, timeout: float) -> None:
    worker = CatchUp(cfg, tcfg, name, timeout)
    try:
        worker.run()
    finally:
        worker.close()
    if not worker.done:
        raise HandoverTimeout(
            f"sync-tables stopped before table {name[0]}.{name[1]} was handed over",
            hint="rerun sync-tables: it continues from the catch-up",
        )
