"""Loop prevention: ``[source] origin = "none"`` (PostgreSQL 16's subscription option).

Design
======

A transaction that a replication applied on the source (another applier, a
PostgreSQL subscription, pglogical...) was committed there with a replication
origin. In a two-way pair (A->B and B->A) every row applied on B would
otherwise travel back to A: a duplicate key, or an UPDATE bouncing forever.
With ``origin = "none"`` such transactions are not applied; ``"any"`` (the
default) applies them, which fan-in setups (C->A->B) need.

**PostgreSQL 16+ sources filter.** The worker passes pgoutput's ``origin``
option (:func:`applier.stream.negotiate.negotiate` sends it only to 16+, 15
refuses unknown options). The walsender then drops every change that carries
an origin while decoding; a transaction left without changes is not sent at
all (Begin is sent lazily), a prepared one neither at PREPARE nor at its
COMMIT PREPARED when that carries the origin too (as when an applier runs it).

**PostgreSQL 15 sources send everything**, and pgoutput marks a transaction
that has an origin with an Origin message: right after Begin or Begin Prepare,
and after the Stream Start of a streamed transaction's first block (not after
Commit Prepared, Rollback Prepared, Stream Commit or Stream Prepare). So the
filter is at the Origin message, before any change of the transaction:

* a transaction (Begin .. Commit): marked skipped; its changes are never sent,
  and its Commit takes the skipped path of
  :meth:`~applier.apply.handlers.dispatch.Applier.end_txn` (counted in
  ``skipped_txns``, its position confirmed; an open group of earlier
  transactions is committed, never rolled back);
* a streamed transaction: its spool is marked, its changes are not kept, and
  its Stream Commit (or Stream Prepare) discards it;
* a prepared transaction: nothing is prepared on the target; its xid is
  remembered here so that its COMMIT PREPARED (which carries no Origin
  message) is skipped instead of being "neither prepared nor applied".
  After a restart between the two that memory is gone: with ``origin =
  "none"``, a COMMIT PREPARED of a transaction not prepared here is then taken
  as one whose PREPARE was filtered (a warning; the strict check stays for
  ``"any"``). A stand-in empty prepared transaction would have kept the check
  strict, but it carries this applier's origin and the other direction's
  applier would answer it with its own stand-in, forever.

The filter is also the belt on 16+ (it never fires there: the server filters).
pgoutput 15 sends no Origin message when the origin has been dropped on the
source; such a transaction cannot be told apart from a local one.
"""

from __future__ import annotations

import logging
from typing import Literal

from applier.lsn import Lsn
from applier.protocol import Origin

log = logging.getLogger("applier.apply")

#: Prepared transactions filtered and not yet finished are remembered up to this
#: many (the source's max_prepared_transactions bounds them in practice).
MAX_REMEMBERED = 10_000


class OriginFilter:
    """Decides at each Origin message; remembers filtered prepared transactions."""

    __slots__ = ("filtered", "none", "prepared")

    def __init__(self, mode: Literal["any", "none"]) -> None:
        self.none = mode == "none"
        #: Transactions not applied because of their origin.
        self.filtered = 0
        #: xids of filtered prepared transactions whose COMMIT/ROLLBACK PREPARED is due.
        self.prepared: set[int] = set()

    def drop(self, lsn: Lsn, m: Origin, xid: int | None, prepared: bool = False) -> bool:
        """True if the transaction the Origin message belongs to is not applied."""
        if not self.none:
            log.debug(
                "transaction from another origin applied (origin = any)",
                extra={"ctx": {"origin": m.name, "xid": xid, "lsn": Lsn(lsn)}},
            )
            return False
        self.filtered += 1
        log.debug(
            "transaction from another origin filtered (origin = none)",
            extra={"ctx": {"xid": xid, "lsn": Lsn(lsn), "origin": m.name}},
        )
        if prepared and xid is not None and len(self.prepared) < MAX_REMEMBERED:
            self.prepared.add(xid)
        return True

    def finish_prepared(self, xid: int, gid: str, end_lsn: Lsn) -> bool:
        """A COMMIT PREPARED found no prepared transaction: True if it was filtered."""
        if xid in self.prepared:
            self.prepared.discard(xid)
            return True
        if not self.none:
            return False
        log.warning(
            "COMMIT PREPARED of a transaction not prepared here: taken as one whose "
            "PREPARE was filtered before a restart (origin = none)",
            extra={"ctx": {"gid": gid, "xid": xid, "lsn": Lsn(end_lsn)}},
        )
        return True
