"""Bad protocol input through the real Applier on a real target (issue 12, items 2 and 15).

Messages are built with the encoder and decoded as the stream would; each bad
one must stop with a clear error (LSN, xid, table) before anything is
committed, the origin unmoved.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import ONE_PAIR, Pair

from applier.apply.handlers.dispatch import Applier
from applier.apply.handlers.spool import SpoolSet
from applier.apply.sql.mapping import Catalog
from applier.apply.target.origin import ensure_origin, origin_progress
from applier.apply.target.session import TargetSession
from applier.errors import ApplierError, ApplyError, DecodeError, ProtocolError
from applier.lsn import Lsn
from applier.protocol import (
    Begin,
    Column,
    Commit,
    CommitPrepared,
    Insert,
    InsertRun,
    PgOutputMessage,
    Relation,
    StreamStart,
    TupleData,
    Update,
)
from applier.protocol.decoder import PgOutputDecoder
from applier.protocol.encoder import encode
from applier.schema import upgrade_target

REL = Relation(None, 16500, "public", "t", "d", (Column(1, "id", 23, -1), Column(0, "v", 25, -1)))


class Kit:
    def __init__(self, pair: Pair, tmp: Path) -> None:
        self.pair = pair
        self.cfg = pair.config()
        self.catalog_conn = pair.sub_conn(autocommit=True)
        ensure_origin(self.catalog_conn, self.cfg.origin)
        upgrade_target(pair.sub_dsn)  # the origin stamp's tables
        self.session = TargetSession(pair.sub_dsn, self.cfg.origin, "on")
        self.applier = Applier(
            self.cfg,
            self.session,
            Catalog(self.catalog_conn),
            SpoolSet(tmp, "bad", 1 << 20),
            Lsn(0),
        )

    def feed(self, *msgs: PgOutputMessage, proto: int = 3) -> None:
        """Encode, decode (as the stream does) and dispatch each message."""
        decoder = PgOutputDecoder(proto)
        for n, m in enumerate(msgs):
            self.applier.dispatch(Lsn(0x1000 + n), decoder.decode(encode(m, proto)))
        self.applier.commit_group()
        self.session.settle()

    def close(self) -> None:
        self.applier.abandon()
        self.session.close()
        self.catalog_conn.close()

    def progress(self) -> Lsn:
        return origin_progress(self.catalog_conn, self.cfg.origin)


@pytest.fixture
def kit(pair: Pair, tmp_path: Path) -> Iterator[Kit]:
    pair.sub_exec("CREATE TABLE t (id int PRIMARY KEY, v text)")
    k = Kit(pair, tmp_path)
    try:
        yield k
    finally:
        k.close()


def _txn(xid: int, *changes: PgOutputMessage) -> list[PgOutputMessage]:
    return [
        Begin(Lsn(0x5000), 0, xid),
        REL,
        *changes,
        Commit(0, Lsn(0x5000), Lsn(0x5100), 0),
    ]


@ONE_PAIR
def test_good_row_applies(kit: Kit) -> None:
    kit.feed(*_txn(700, Insert(None, REL.oid, TupleData.text(b"1", b"a"))))
    assert kit.pair.sub_exec("SELECT id, v FROM t") == [(1, "a")]
    assert kit.progress() == Lsn(0x5100)


@pytest.mark.parametrize(
    "values", [(b"1", b"a", b"extra"), (b"1",)], ids=["more_columns", "fewer_columns"]
)
@ONE_PAIR
def test_tuple_not_matching_its_relation(kit: Kit, values: tuple[bytes, ...]) -> None:
    bad = Insert(None, REL.oid, TupleData.text(*values))
    with pytest.raises(ProtocolError) as info:
        kit.feed(*_txn(701, Insert(None, REL.oid, TupleData.text(b"2", b"b")), bad))
    err = info.value
    assert err.context["table"] == "public.t" and err.context["xid"] == 701, err
    assert "lsn" in err.context and "column" in str(err)
    kit.applier.abandon()
    assert kit.pair.sub_exec("SELECT count(*) FROM t") == [(0,)]
    assert kit.progress() == Lsn(0)


@pytest.mark.parametrize("dump", ["skipped", "none"])
@ONE_PAIR
def test_tuple_not_matching_its_relation_on_a_skipped_table(kit: Kit, dump: str) -> None:
    """A skip rule does not hide a corrupt stream: the rule's check came before the
    width's, and a kept change wider than its relation failed with an IndexError at
    the transaction's end, when its row was written to applier.skipped_changes."""
    kit.catalog_conn.execute(
        "INSERT INTO applier.skip_rules (origin, kind, table_pattern, ops, dump) "
        "VALUES (%s, 'object', 'public.t', '{update}', %s)",
        (kit.cfg.origin, dump),
    )
    kit.applier.rules.load(kit.catalog_conn)
    bad = Update(None, REL.oid, None, None, TupleData.text(b"1", b"a", b"extra"))
    with pytest.raises(ProtocolError) as info:
        kit.feed(*_txn(702, Insert(None, REL.oid, TupleData.text(b"2", b"b")), bad))
    err = info.value
    assert err.context["table"] == "public.t" and err.context["xid"] == 702, err
    kit.applier.abandon()
    assert kit.pair.sub_exec("SELECT count(*) FROM t") == [(0,)]
    assert kit.pair.sub_exec("SELECT count(*) FROM applier.skipped_changes") == [(0,)]
    assert kit.progress() == Lsn(0)


@pytest.mark.parametrize("skipped", [False, True], ids=["applied", "applied_before"])
@pytest.mark.parametrize("cut", [1, -1], ids=["truncated", "trailing_byte"])
@ONE_PAIR
def test_a_malformed_insert_in_a_run_is_an_error_skipped_or_not(
    kit: Kit, skipped: bool, cut: int
) -> None:
    """An InsertRun's rows are bytes the stream did not decode (only their head was
    read): each must be decoded, as each Insert outside a run is, also when its
    transaction was applied before and is skipped (its rows were then dropped
    unread: a corrupt stream passed)."""
    good = encode(Insert(None, REL.oid, TupleData.text(b"2", b"b")), 3)
    bad = encode(Insert(None, REL.oid, TupleData.text(b"3", b"c")), 3)
    bad = bad[:-1] if cut == 1 else bad + b"\x00"
    first = Insert(None, REL.oid, TupleData.text(b"1", b"a"))
    run = InsertRun(first, [good, bad], [0x1003, 0x1004])
    if skipped:  # the transaction ends before the origin's progress: applied before
        kit.applier.progress = Lsn(0x6000)
    decoder = PgOutputDecoder(3)
    begin, rel, commit = _txn(703)
    with pytest.raises(DecodeError) as info:
        for n, m in enumerate([begin, rel]):
            kit.applier.dispatch(Lsn(0x1000 + n), decoder.decode(encode(m, 3)))
        kit.applier.dispatch(Lsn(0x1002), run)
        kit.applier.dispatch(Lsn(0x1005), decoder.decode(encode(commit, 3)))
    assert info.value.offset is not None, info.value
    kit.applier.abandon()
    assert kit.pair.sub_exec("SELECT count(*) FROM t") == [(0,)]
    assert kit.progress() == Lsn(0)


@ONE_PAIR
def test_stream_continuation_for_an_unknown_transaction(kit: Kit) -> None:
    with pytest.raises(ProtocolError) as info:
        kit.feed(StreamStart(702, False))
    assert info.value.context["xid"] == 702 and "lsn" in info.value.context
    assert kit.applier.spools.get(702) is None
    assert kit.progress() == Lsn(0)


@ONE_PAIR
def test_commit_prepared_of_an_unknown_transaction(kit: Kit) -> None:
    msg = CommitPrepared(0, Lsn(0x6000), Lsn(0x6100), 0, 703, "g")
    with pytest.raises(ApplyError) as info:
        kit.feed(msg)
    ctx = info.value.context
    assert ctx["xid"] == 703 and ctx["gid"].endswith("_703") and "lsn" in ctx
    assert info.value.hint
    assert kit.progress() == Lsn(0)


@ONE_PAIR
def test_commit_prepared_already_applied_is_skipped(kit: Kit) -> None:
    kit.applier.progress = Lsn(0x7000)
    kit.feed(CommitPrepared(0, Lsn(0x6000), Lsn(0x6100), 0, 704, "g"))
    assert kit.applier.skipped_txns == 1


@ONE_PAIR
def test_catalog_error_is_an_apply_error(kit: Kit) -> None:
    """A catalog look-up the target refuses (not a lost connection): no traceback."""
    pair = kit.pair
    role = f"weak_{uuid.uuid4().hex[:8]}"
    pair.sub_exec(f"CREATE ROLE {role} LOGIN")

    def drop_role() -> None:
        pair.sub.execute(f"DROP ROLE IF EXISTS {role}")

    pair.cleanup.append(drop_role)
    pair.sub_exec("REVOKE SELECT ON pg_catalog.pg_trigger FROM PUBLIC")
    weak = psycopg.connect(pair.sub.dsn(pair.sub_db, user=role), autocommit=True)
    try:
        kit.applier.catalog = kit.applier.rels.catalog = Catalog(weak)
        with pytest.raises(ApplierError) as info:
            kit.feed(*_txn(705, Insert(None, REL.oid, TupleData.text(b"3", b"c"))))
    finally:
        weak.close()
    err = info.value
    assert isinstance(err, ApplyError) and err.sqlstate == "42501", err
    assert err.context["table"] == "public.t" and err.context["xid"] == 705
    assert kit.progress() == Lsn(0)
