"""Captured DDL: an ``applier.ddl`` logical message, run at its position in the stream.

The source's capture (:mod:`applier.ddl`: the event trigger of ``applier ddl
install``, or ``applier ddl run``) emits each statement as a *transactional*
logical decoding message (:mod:`applier.ddl.message`) inside the source
transaction that ran it. pgoutput sends it among that transaction's changes
(``messages = true``), so here it is one more message of the transaction in
hand, in state ``TXN`` or ``PREPARE``:

1. a message of another prefix is ignored, as before;
2. a non-transactional one stops the worker (it belongs to no transaction, so
   it cannot be applied exactly once with the data around it), unless a ddl
   skip rule names its LSN;
3. in a transaction applied before (``txn.skip``: its end is at or below the
   origin's progress, prepared here already, or filtered by its origin) it is
   not run; under a transaction skip rule it is kept as skipped;
4. a ddl skip rule at its LSN (``applier skip add --ddl-lsn LSN``) skips it: the
   statement is kept in ``applier.skipped_changes`` and the rule marked done in
   the target transaction that moves the origin past it (:class:`KeptDdl`);
5. a message applier did not sign (:mod:`~applier.apply.handlers.ddlsig`: the
   source verifies it) stops the worker (exit 3), naming its LSN and xid and
   the ``applier skip add --config F --ddl-lsn LSN`` that skips it; nothing of
   it is read;
6. else :func:`~applier.ddl.classify.classify` decides: ignored (temporary or
   not ours: counted), refused (the worker stops, exit 3, naming the statement,
   its LSN, the xid and the ``applier skip add --config F --ddl-lsn LSN`` that
   skips it), or run through the schema seam
   (:class:`~applier.apply.handlers.schema.SchemaChanges`): a barrier, in the
   open target transaction, recorded in ``applier.schema_changes``, so it
   commits with the origin's stamp or not at all (a kill before that commit
   leaves nothing, and the stream brings it again).

In a streamed transaction the message is spooled with the changes (its bytes,
as :data:`~applier.protocol.decoder.DEFERRED_TAGS` keeps them) and comes here
at the replay of its Stream Commit; a live transaction is dropped first
(:mod:`applier.apply.handlers.streamed`). In a two-phase transaction it runs
in the transaction that PREPARE TRANSACTION prepares, like the rows.

Statements run on the apply session, whose replication origin is set up
(``pg_replication_origin_session_setup``): a capture on the target (two-way)
sees ``pg_replication_origin_session_is_setup()`` and does not emit them back.

A table added to our publication (``ALTER PUBLICATION ... ADD TABLE``, which is
itself never run on the target) is held (:mod:`applier.apply.rules.ddlsync`)
and handed to :attr:`DdlReplay.fill`: the worker starts ``applier sync-tables``
for it once the transaction committed (:mod:`applier.apply.handlers.tablefill`).

With ``[ddl] allow_from_functions``, a function that runs several statements
sends one message each, all carrying the caller's text: it runs once per
source transaction.
"""

from __future__ import annotations

import logging
from typing import Protocol

from applier.apply.core.states import Txn
from applier.apply.handlers.ddlsig import Signatures
from applier.apply.handlers.schema import SchemaChanges
from applier.apply.handlers.tablefill import TableFill
from applier.apply.rules.ddlsync import created, held, hold
from applier.apply.rules.skiprules import KeptDdl, Rule, SkipRules
from applier.apply.rules.tablesync import TableSyncs
from applier.apply.sql.ddlplan import SchemaStatement
from applier.config import Config
from applier.ddl.classify import Verdict, classify
from applier.ddl.message import PREFIX, DdlMessage, decode
from applier.errors import ApplyError, PermanentError, ProtocolError
from applier.lsn import Lsn
from applier.protocol import Message

log = logging.getLogger("applier.apply")


class DdlHost(Protocol):
    """What the DDL part reads of the Applier."""

    @property
    def txn(self) -> Txn | None: ...
    @property
    def rules(self) -> SkipRules: ...
    @property
    def syncs(self) -> TableSyncs: ...


class DdlReplay:
    """``applier.ddl`` messages: skipped, ignored, refused or run (see the module doc)."""

    def __init__(
        self,
        host: DdlHost,
        cfg: Config,
        schema: SchemaChanges,
        fill: TableFill | None = None,
        signatures: Signatures | None = None,
    ) -> None:
        self.host = host
        #: Asked whether each message is applier's before it is read (see ddlsig).
        self.signatures = signatures or Signatures(cfg.source.conninfo())
        self.cfg = cfg
        self.schema = schema
        #: Told the included tables an ALTER PUBLICATION added (see the module doc).
        self.fill = fill if fill is not None else TableFill(cfg, host)
        #: Statements run, skipped by a rule, ignored (not ours or temporary).
        self.ran = 0
        self.skipped = 0
        self.ignored = 0
        #: (xid, commit LSN) and the caller's texts run in it (allow_from_functions).
        self._ran_in: tuple[int, Lsn] | None = None
        self._texts: set[str] = set()

    def on_message(self, lsn: Lsn, m: Message) -> None:
        if m.prefix != PREFIX:
            log.debug(
                "logical decoding message ignored",
                extra={"ctx": {"prefix": m.prefix, "lsn": m.lsn, "transactional": m.transactional}},
            )
            return
        rule = self.host.rules.ddl_rule(m.lsn)
        txn = self.host.txn
        if not m.transactional or txn is None:
            self._outside(m, rule is not None)
            return
        if txn.skip:
            return  # applied before (or not to be applied): nothing of it runs
        if rule is not None or txn.rule is not None:
            self._skip(txn, m, rule or txn.rule)
            return
        self._verify(txn, m)
        ddl = _decode(m)
        verdict = classify(ddl, self.cfg)
        held = tuple(t for t in verdict.published if hold(self.host.syncs, t, txn.commit_lsn))
        if held:
            self.fill.request(held, txn.commit_lsn)
        if verdict.ignored is not None:
            self.ignored += 1
            log.info(
                "captured DDL not run: %s",
                verdict.ignored,
                extra={"ctx": {"tag": ddl.tag, "lsn": m.lsn, "xid": txn.xid}},
            )
            return
        if verdict.refusal is not None:
            raise self._stop(f"captured DDL refused: {verdict.refusal}", ddl, m, txn, verdict)
        if verdict.from_function and self._repeated(txn, ddl):
            return
        if self._synced_elsewhere(ddl, verdict, txn, m.lsn):
            return
        st = SchemaStatement(
            "ddl",
            ddl.tag,
            verdict.table[0] if verdict.table else None,
            verdict.table[1] if verdict.table else None,
            verdict.statement,
            ddl.statement,
            ddl.search_path,
            hint=self._hint(m.lsn),
        )
        try:
            self.schema.run(m.lsn, [st])
        except ApplyError as e:
            e.context["ddl_lsn"] = str(m.lsn)
            e.context["skip_command"] = self._skip_command(m.lsn)
            raise
        self.ran += 1
        if ddl.tag == "CREATE TABLE" and verdict.table is not None:
            created(self.host.syncs, verdict.table)

    def _verify(self, txn: Txn, m: Message) -> None:
        """A message applier did not sign stops the worker before anything of it is read."""
        why = self.signatures.refusal(m.content)
        if why is None:
            return
        raise ApplyError(
            f"the {PREFIX} message at {Lsn(m.lsn)} (xid {txn.xid}) was not written by "
            f"applier's capture ({why}): not run",
            lsn=str(m.lsn),
            xid=txn.xid,
            ddl_lsn=str(m.lsn),
            skip_command=self._skip_command(m.lsn),
            hint="a source role wrote it with pg_logical_emit_message, or the capture was "
            "uninstalled and installed again (a new key); nothing of it ran: skip it (its "
            f"content is kept in applier.skipped_changes) with {self._skip_command(m.lsn)}",
        )

    def _synced_elsewhere(self, ddl: DdlMessage, verdict: Verdict, txn: Txn, lsn: Lsn) -> bool:
        """A statement on a table sync-tables is copying: its copy and catch-up bring it
        (:func:`~applier.apply.rules.ddlsync.held`); a CREATE TABLE makes the table, so
        it always runs here."""
        if ddl.tag == "CREATE TABLE" or verdict.table is None:
            return False
        if not held(self.host.syncs, verdict.table, txn.commit_lsn):
            return False
        self.ignored += 1
        log.info(
            "captured DDL left to sync-tables, which copies the table",
            extra={
                "ctx": {
                    "tag": ddl.tag,
                    "table": ".".join(verdict.table),
                    "lsn": lsn,
                    "xid": txn.xid,
                }
            },
        )
        return True

    def _repeated(self, txn: Txn, ddl: DdlMessage) -> bool:
        """A caller's text run already in this transaction (allow_from_functions)."""
        at = (txn.xid, txn.commit_lsn)
        if self._ran_in != at:
            self._ran_in, self._texts = at, set()
        if ddl.statement in self._texts:
            return True
        self._texts.add(ddl.statement)
        return False

    def _skip(self, txn: Txn, m: Message, rule: Rule) -> None:
        """Keep the statement a rule skips (written at the transaction's end)."""
        try:
            ddl: DdlMessage | None = decode(m.content, str(m.lsn))
        except ProtocolError:
            ddl = None  # unreadable: kept as its bytes' text
        verdict = classify(ddl, self.cfg) if ddl is not None else None
        statement = (
            (verdict.statement if verdict and verdict.runs else ddl.statement)
            if ddl is not None
            else m.content.decode(errors="replace")
        )
        txn.kept.append(
            KeptDdl(
                rule,
                m.lsn,
                txn.n,
                ddl.tag if ddl else "?",
                statement,
                ddl.search_path if ddl else "",
                verdict.table if verdict else None,
            )
        )
        self.skipped += 1
        log.warning(
            "captured DDL skipped by %s",
            rule.describe(),
            extra={"ctx": {"lsn": m.lsn, "xid": txn.xid, "statement": statement}},
        )

    def _outside(self, m: Message, skipped: bool) -> None:
        if skipped:
            log.warning("a non-transactional %s message skipped by a rule", PREFIX,
                        extra={"ctx": {"lsn": m.lsn}})  # fmt: skip
            return
        raise PermanentError(
            f"a non-transactional {PREFIX} message: DDL is replayed only inside the "
            "transaction that ran it",
            lsn=str(m.lsn),
            hint="applier's capture emits it with pg_logical_emit_message(true, ...); "
            f"skip this one with {self._skip_command(m.lsn)}",
        )

    def _stop(
        self, why: str, ddl: DdlMessage, m: Message, txn: Txn, verdict: Verdict
    ) -> ApplyError:
        table = ".".join(verdict.table) if verdict.table else None
        return ApplyError(
            f"{why}; statement: {ddl.statement}",
            lsn=str(m.lsn),
            xid=txn.xid,
            table=table,
            ddl_lsn=str(m.lsn),
            skip_command=self._skip_command(m.lsn),
            hint=self._hint(m.lsn),
        )

    def _hint(self, lsn: Lsn) -> str:
        return (
            "run its equivalent on the target by hand if it is needed there, then skip it "
            f"(it is kept in applier.skipped_changes): {self._skip_command(lsn)}"
        )

    def _skip_command(self, lsn: Lsn) -> str:
        return f"applier skip add --config {self.cfg.path or 'F'} --ddl-lsn {Lsn(lsn)}"


def _decode(m: Message) -> DdlMessage:
    """The message's statement; unreadable content stops the worker (exit 3: a restart
    reads the same bytes), with the skip command the format's error names."""
    try:
        return decode(m.content, str(m.lsn))
    except ProtocolError as e:
        raise PermanentError(e.message, hint=e.hint, **e.context) from None


__all__ = ["DdlHost", "DdlReplay"]
