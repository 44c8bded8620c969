"""Schema changes: the one seam every change of the target's schema goes through.

Two kinds of schema change reach the worker (issue 33): a Relation message that
names what the target lacks (``[schema] follow``, planned by
:mod:`applier.apply.handlers.follow`) and a DDL statement captured on the source
(a transactional logical message, :mod:`applier.ddl`). Each becomes a list of
:class:`~applier.apply.sql.ddlplan.SchemaStatement` handed to
:meth:`SchemaChanges.run`, which, in the target transaction of the source
transaction being applied:

1. is a *barrier*: every row held so far (merged UPDATEs and DELETEs, the run of
   INSERTs in hand, a lane's COPY) is sent first and its result awaited, so the
   target sees the changes and the statement in the stream's order;
2. runs each statement (under its ``search_path`` if it has one, the session's
   pinned path put back after it) and writes its row of
   ``applier.schema_changes`` in the same transaction
   (:func:`~applier.apply.target.schemarun.run_statements`);
3. forgets the mappings of the tables it changed (all of them when a statement
   names no table), so the next change of each is mapped against the target's
   catalog as it is now; until the transaction's commit is known, mappings are
   looked up through the apply session itself (:meth:`SchemaChanges.catalog_view`),
   the only connection that sees the uncommitted change;
4. marks the source transaction as a barrier: it commits alone, never grouped
   with later source transactions (an enum value added cannot be used in the
   target transaction that added it; parallel apply will wait for it).

Exactly once
============

The statements and their records are in the target transaction whose COMMIT
stamps the origin with the source transaction's end: a crash or a kill anywhere
before that commit leaves nothing of them, and the stream brings the transaction
again; after it, the origin is past it and it is never run twice. This holds in
plain transactions, in streamed ones replayed at Stream Commit, in group commit
(the earlier transactions of the group commit with it), and in careful or
one-by-one replay after a failure (the statement runs outside any change's
savepoint: its failure stops the worker). A streamed transaction applied live
(``streaming = "parallel"``) is not: a live transaction may still be rolled
back for another one committing first, which would leave mappings built on a
schema that is gone; it is restreamed and replayed from its spool at its
commit instead (:class:`~applier.apply.handlers.streamed.LiveRestream`).

A failure raises an :class:`~applier.errors.ApplyError` (exit 3) naming the
statement, the LSN, xid and table, with the statement's hint; the target
transaction is rolled back as after any failure.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from psycopg import sql

from applier.apply.handlers.ports import SchemaHost
from applier.apply.handlers.relations import RelationCache
from applier.apply.handlers.streamed import LiveRestream
from applier.apply.sql.ddlplan import SchemaStatement
from applier.apply.sql.mapping import Catalog
from applier.apply.target.schemarun import run_statements, run_statements_apart, session_view
from applier.apply.target.session import TargetSession
from applier.lsn import Lsn

log = logging.getLogger("applier.apply")


class SchemaChanges:
    """Runs schema statements in the open target transaction (see the module doc)."""

    def __init__(self, host: SchemaHost, session: TargetSession, rels: RelationCache) -> None:
        self.host = host
        self.session = session
        self.rels = rels
        #: The commit LSN of the last source transaction that changed the schema:
        #: until the session has committed past it, mappings are looked up through
        #: the session (None: nothing changed since the session started).
        self.changed_at: Lsn | None = None
        #: The session's catalog view, kept while ``changed_at`` holds (its caches).
        self._in_session: Catalog | None = None
        #: Schema statements run (and recorded) in this session.
        self.statements = 0
        rels.view = self.catalog_view
        rels.apply_schema = self.run

    def run(self, lsn: Lsn, changes: Sequence[SchemaStatement]) -> None:
        """Run ``changes`` in the target transaction of the source transaction in hand."""
        if not changes:
            return
        host, session = self.host, self.session
        txn = host.txn
        assert txn is not None and not txn.skip
        live = host.live
        if live is not None and live.txn is txn:
            raise LiveRestream(txn.xid, "a schema change is applied at the transaction's commit")
        host.send_held()  # the merger's rows; run_statements sends the run in hand
        if txn.gid is not None and all(c.source == "relation" for c in changes):
            # Not inside a prepared transaction (run_statements_apart says why).
            conn = self.rels.catalog.conn
            texts = run_statements_apart(
                conn, session.origin, lsn, txn.xid, txn.commit_lsn, changes
            )
        else:
            if not session.in_txn:
                session.begin()
            texts = run_statements(session, lsn, txn.xid, txn.commit_lsn, changes)
            self.changed_at = txn.commit_lsn
        txn.barrier = True
        self._in_session = None
        self.rels.catalog.forget_cached()  # a type's shape may have changed with it
        names = {(c.schema_name or "", c.table_name) for c in changes if c.table_name is not None}
        unnamed = any(c.table_name is None for c in changes)
        self.rels.forget_tables(None if unnamed else names)
        self.statements += len(changes)
        for st, text in zip(changes, texts, strict=True):
            log.info(
                "schema change applied on the target",
                extra={
                    "ctx": {
                        "source": st.source,
                        "tag": st.command_tag,
                        "table": st.qualname,
                        "statement": text,
                        "lsn": Lsn(lsn),
                        "xid": txn.xid,
                    }
                },
            )

    def query(self, query: sql.Composed | str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Rows of ``query`` run on the apply session: what its open transaction sees."""
        with session_view(self.session) as conn:
            return conn.execute(query, params).fetchall()

    @contextmanager
    def catalog_view(self) -> Iterator[Catalog]:
        """The catalog to map a table in: the session's own while a schema change
        may not be committed yet, else the catalog connection's."""
        changed = self.changed_at
        if changed is not None and self.session.committed > changed:
            self.changed_at = changed = None
            self._in_session = None
        if changed is None:
            # The relation cache owns the catalog connection's view (one owner).
            yield self.rels.catalog
            return
        with session_view(self.session) as conn:
            if self._in_session is None:
                self._in_session = Catalog(conn)
            yield self._in_session


__all__ = ["SchemaChanges"]
