"""Golden tests: a workload with every message kind, decoded through LogicalStream, field by field.

Run against the shared PG15 and PG18 publishers. The walsender gets
logical_decoding_work_mem=64kB as a startup option, so the big transaction
is streamed (Stream Start/Stop/Abort/Commit) while the small ones are not.
"""

from __future__ import annotations

from streamkit import (
    SMALL_WORK_MEM,
    Golden,
    emit_marker,
    golden_fixture,  # noqa: F401 - the `golden` fixture
    open_stream,
    read_until_marker,
    slot_position,
)
from workload import BIG, Workload

from applier.localpg import LocalCluster
from applier.lsn import Lsn
from applier.protocol import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
)
from applier.stream import ReplicationConnection

Item = tuple[Lsn, PgOutputMessage]


def _txn(items: list[Item], xid: int) -> list[Item]:
    """The messages of the (non-streamed) transaction ``xid``: Begin .. Commit."""
    start = next(i for i, (_, m) in enumerate(items) if isinstance(m, Begin) and m.xid == xid)
    end = next(i for i in range(start, len(items)) if isinstance(items[i][1], Commit))
    return items[start : end + 1]


def _rows(items: list[Item]) -> list[PgOutputMessage]:
    return [m for _, m in items if isinstance(m, Insert | Update | Delete | Truncate)]


def test_golden_stream(golden: Golden) -> None:
    cluster, db, wl, _ = golden
    slot = f"g_{db}"
    before = slot_position(cluster, db, slot)
    stream = open_stream(
        cluster,
        db,
        slot,
        options=SMALL_WORK_MEM,
        streaming="on",
        two_phase=True,
        report_flush=False,
    )
    try:
        assert stream.proto_version == (3 if cluster.version == 15 else 4)
        assert (stream.streaming, stream.two_phase) == ("on", True)
        items = read_until_marker(stream)
    finally:
        stream.stop()
    assert slot_position(cluster, db, slot) == before  # report_flush=False never advances the slot
    rels = {m.name: m for _, m in items if isinstance(m, Relation)}
    types = {m.name: m for _, m in items if isinstance(m, Type)}

    _check_lsn_order(items)
    _check_default_identity(_txn(items, wl.xids["def"]), rels["t_def"])
    _check_index_identity(_txn(items, wl.xids["idx"]), rels["t_idx"])
    _check_full_identity(_txn(items, wl.xids["full"]), rels["t_full"])
    _check_nothing_identity(_txn(items, wl.xids["nothing"]), rels["t_nothing"])
    _check_types(_txn(items, wl.xids["type"]), rels["t_type"], types)
    _check_truncate(_txn(items, wl.xids["truncate"]), rels)
    _check_messages(items, wl)
    _check_streamed(items, wl, rels["t_big"])
    _check_two_phase(items, wl)
    _check_origin(_txn(items, wl.xids["origin"]), wl)


def _check_lsn_order(items: list[Item]) -> None:
    commits = [m for _, m in items if isinstance(m, Commit)]
    ends = [c.end_lsn for c in commits]
    assert ends == sorted(ends) and len(set(ends)) == len(ends)
    for lsn, m in items:
        if isinstance(m, Commit):
            assert lsn == m.end_lsn and m.commit_lsn < m.end_lsn and m.flags == 0
    # Begin announces the commit LSN its Commit carries.
    begins = [m for _, m in items if isinstance(m, Begin)]
    assert [b.final_lsn for b in begins] == [c.commit_lsn for c in commits]
    # Data messages are stamped with non-decreasing LSNs (Relation/Type carry 0/0).
    data = [lsn for lsn, m in items if lsn and isinstance(m, Insert | Update | Delete | Commit)]
    assert data == sorted(data)


def _check_default_identity(txn: list[Item], rel: Relation) -> None:
    assert rel.replident == "d" and [c.name for c in rel.key_columns] == ["id"]
    ins1, ins2, ins3, upd, upd_key, upd_toast, dele = _rows(txn)
    assert isinstance(ins1, Insert) and ins1.new == TupleData(b"ttn", (b"1", b"one", None))
    assert isinstance(ins2, Insert) and ins2.new.values == (b"2", b"two", None)
    assert isinstance(ins3, Insert) and ins3.new.values == (b"3", b"toast", BIG.encode())
    # Key unchanged: no old tuple.
    assert isinstance(upd, Update) and upd.old is None and upd.old_kind is None
    assert upd.new.values == (b"1", b"uno", None)
    # Key changed: the old key ('K'), non-key columns NULL.
    assert isinstance(upd_key, Update) and upd_key.old_kind == "K"
    assert upd_key.old == TupleData(b"tnn", (b"2", None, None))
    assert upd_key.new.values == (b"20", b"two", None)
    # TOASTed column left alone: 'u', no value.
    assert isinstance(upd_toast, Update) and upd_toast.new.kinds == b"ttu"
    assert upd_toast.new.values == (b"3", b"still toast", None)
    assert upd_toast.new.unchanged_toast_columns() == (2,)
    assert isinstance(dele, Delete) and dele.old_kind == "K"
    assert dele.old == TupleData(b"tnn", (b"1", None, None))
    assert all(m.relation_oid == rel.oid for m in _rows(txn))  # type: ignore[union-attr]


def _check_index_identity(txn: list[Item], rel: Relation) -> None:
    assert rel.replident == "i" and [c.name for c in rel.key_columns] == ["a", "b"]
    ins, upd, dele = _rows(txn)
    assert isinstance(ins, Insert) and ins.new.values == (b"1", b"1", b"a")
    assert isinstance(upd, Update) and upd.old_kind == "K"
    assert upd.old == TupleData(b"ttn", (b"1", b"1", None))
    assert upd.new.values == (b"1", b"2", b"a")
    assert isinstance(dele, Delete) and dele.old == TupleData(b"ttn", (b"1", b"2", None))


def _check_full_identity(txn: list[Item], rel: Relation) -> None:
    assert rel.replident == "f" and all(c.is_key for c in rel.columns)
    _, _, upd, dele = _rows(txn)
    assert isinstance(upd, Update) and upd.old_kind == "O"
    assert upd.old == TupleData(b"tt", (b"1", b"f")) and upd.new.values == (b"1", b"g")
    assert isinstance(dele, Delete) and dele.old_kind == "O"
    assert dele.old == TupleData(b"tn", (b"2", None))


def _check_nothing_identity(txn: list[Item], rel: Relation) -> None:
    assert rel.replident == "n" and rel.key_columns == ()
    (ins,) = _rows(txn)
    assert isinstance(ins, Insert) and ins.new.values == (b"7", b"n")


def _check_types(txn: list[Item], rel: Relation, types: dict[str, Type]) -> None:
    mood, pt = types["mood"], types["pt"]
    assert (mood.namespace, pt.namespace) == ("public", "public")
    kinds = [type(m).__name__ for _, m in txn]
    # Type messages come before the Relation that uses them.
    assert kinds.index("Type") < kinds.index("Relation") < kinds.index("Insert")
    assert [c.type_oid for c in rel.columns] == [23, mood.oid, pt.oid]
    (ins,) = _rows(txn)
    assert isinstance(ins, Insert) and ins.new.values == (b"1", b"happy", b"(1,2)")


def _check_truncate(txn: list[Item], rels: dict[str, Relation]) -> None:
    (trunc,) = _rows(txn)
    assert isinstance(trunc, Truncate)
    assert trunc.cascade and trunc.restart_identity and trunc.options == 3
    assert set(trunc.relation_oids) == {rels["t_parent"].oid, rels["t_child"].oid}


def _check_messages(items: list[Item], wl: Workload) -> None:
    txn = _txn(items, wl.xids["message"])
    (tx_msg,) = [m for _, m in txn if isinstance(m, Message)]
    assert tx_msg.transactional and (tx_msg.prefix, tx_msg.content) == ("tx", b"in txn")
    nontx = [(lsn, m) for lsn, m in items if isinstance(m, Message) and not m.transactional]
    ((lsn, msg),) = nontx
    assert (msg.prefix, msg.content) == ("nontx", b"\xff\x00") and lsn == msg.lsn
    # A non-transactional message is sent on its own, between transactions.
    idx = next(i for i, (_, m) in enumerate(items) if m is msg)
    assert isinstance(items[idx - 1][1], Commit)


def _check_streamed(items: list[Item], wl: Workload, rel: Relation) -> None:
    xid = wl.xids["stream"]
    starts = [m for _, m in items if isinstance(m, StreamStart)]
    assert len(starts) >= 2 and all(s.xid == xid for s in starts)
    assert starts[0].first_segment and not any(s.first_segment for s in starts[1:])
    # Blocks are balanced: every Stream Start has its Stream Stop before the next.
    depth = 0
    for _, m in items:
        if isinstance(m, StreamStart):
            assert depth == 0
            depth = 1
        elif isinstance(m, StreamStop):
            assert depth == 1
            depth = 0
    (abort,) = [m for _, m in items if isinstance(m, StreamAbort)]
    assert abort.xid == xid and abort.subxid != xid  # the rolled-back savepoint only
    (commit,) = [(lsn, m) for lsn, m in items if isinstance(m, StreamCommit)]
    assert commit[1].xid == xid and commit[0] == commit[1].end_lsn
    inserts = [m for _, m in items if isinstance(m, Insert) and m.relation_oid == rel.oid]
    sub = {m.new.values[0] for m in inserts if m.xid == abort.subxid}
    kept = {m.new.values[0] for m in inserts if m.xid != abort.subxid}
    assert all(m.xid is not None for m in inserts)  # stream block messages carry an xid
    assert kept == {b"%d" % i for i in range(0, 1501)}
    assert sub and sub <= {b"%d" % i for i in range(1501, 4501)}


def _check_two_phase(items: list[Item], wl: Workload) -> None:
    for name, finish in (("2pc_commit", CommitPrepared), ("2pc_rollback", RollbackPrepared)):
        xid = wl.xids[name]
        seq = [(lsn, m) for lsn, m in items if getattr(m, "xid", None) == xid]
        kinds = [type(m) for _, m in seq]
        assert kinds == [BeginPrepare, Prepare, finish]
        (_, bp), (plsn, prep), (flsn, fin) = seq
        assert isinstance(bp, BeginPrepare) and isinstance(prep, Prepare)
        assert bp.gid == prep.gid == fin.gid and bp.gid.startswith(f"g_{name[4:]}_")  # type: ignore[union-attr]
        assert bp.prepare_lsn == prep.prepare_lsn and bp.end_lsn == prep.end_lsn == plsn
        assert flsn > plsn
        if isinstance(fin, RollbackPrepared):
            assert fin.prepare_end_lsn == prep.end_lsn and fin.rollback_end_lsn == flsn
            assert fin.prepare_ts == prep.prepare_ts <= fin.rollback_ts
        else:
            assert isinstance(fin, CommitPrepared) and fin.end_lsn == flsn
    # The prepared transaction's change sits between Begin Prepare and Prepare.
    start = next(i for i, (_, m) in enumerate(items) if isinstance(m, BeginPrepare))
    assert isinstance(items[start + 1][1], Insert)
    assert items[start + 1][1].new.values == (b"9", b"commit")


def _check_origin(txn: list[Item], wl: Workload) -> None:
    (origin,) = [m for _, m in txn if isinstance(m, Origin)]
    assert origin.name == wl.origin and origin.origin_lsn == Lsn.parse("0/ABCDEF")
    kinds = [type(m) for _, m in txn]
    assert kinds.index(Origin) == 1  # right after Begin


def test_binary_mode(publisher: tuple[LocalCluster, str]) -> None:
    cluster, db = publisher
    cluster.execute(
        "CREATE TABLE b (id int PRIMARY KEY, v text, f float8, n int8);"
        "CREATE PUBLICATION pub FOR TABLE b",
        db,
    )
    with ReplicationConnection.open(cluster.dsn(db)) as rc:
        rc.create_slot(f"b_{db}")
    cluster.execute("INSERT INTO b VALUES (1, 'hi', 1.5, NULL)", db)
    emit_marker(cluster, db)
    stream = open_stream(cluster, db, f"b_{db}", binary=True, report_flush=False)
    try:
        items = read_until_marker(stream)
    finally:
        stream.stop()
    (ins,) = [m for _, m in items if isinstance(m, Insert)]
    assert ins.new.kinds == b"bbbn"
    assert ins.new.values == (
        (1).to_bytes(4, "big"),
        b"hi",
        bytes.fromhex("3ff8000000000000"),
        None,
    )
