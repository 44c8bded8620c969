"""Decoding hand-written bytes: every field of every message kind, checked against the spec.

The bytes here are typed out from the protocol chapter, not produced by the
encoder, so an encoder/decoder pair that agree on a wrong layout still fails.
"""

from __future__ import annotations

import datetime as dt

from protocol_helpers import decode_in

from applier.lsn import Lsn
from applier.protocol import (
    BINARY,
    NULL,
    TEXT,
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputDecoder,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
    encode,
)

h = bytes.fromhex
# Reused field values: LSN 0/16B3748, LSN 1/2, timestamp 2023-01-01 UTC, xid 1234.
LSN_A = "00000000016b3748"
LSN_B = "0000000100000002"
TS = "0002942748d56000"  # 725846400000000 us = 2023-01-01 00:00 UTC
TS_US = 725_846_400_000_000
XID = "000004d2"


def test_begin() -> None:
    msg = decode_in(b"B" + h(LSN_A + TS + XID))
    assert msg == Begin(final_lsn=Lsn(0x16B3748), commit_ts=TS_US, xid=1234)
    assert isinstance(msg, Begin) and isinstance(msg.final_lsn, Lsn)
    assert str(msg.final_lsn) == "0/16B3748"
    assert msg.commit_time == dt.datetime(2023, 1, 1, tzinfo=dt.UTC)
    assert msg.kind == "begin"


def test_commit() -> None:
    msg = decode_in(b"C" + h("00" + LSN_A + LSN_B + TS))
    assert msg == Commit(
        flags=0, commit_lsn=Lsn(0x16B3748), end_lsn=Lsn(0x1_0000_0002), commit_ts=TS_US
    )
    assert isinstance(msg, Commit) and msg.commit_time.year == 2023


def test_origin() -> None:
    msg = decode_in(b"O" + h(LSN_B) + b"node_1\0")
    assert msg == Origin(origin_lsn=Lsn(0x1_0000_0002), name="node_1")


def test_relation() -> None:
    data = (
        b"R"
        + h("00004000")  # oid 16384
        + b"public\0"
        + b"accounts\0"
        + b"f"  # replica identity full
        + h("0002")  # 2 columns
        + h("01") + b"id\0" + h("00000017") + h("ffffffff")  # key, int4, typmod -1
        + h("00") + b"name\0" + h("00000413") + h("00000024")  # varchar(32): typmod 36
    )  # fmt: skip
    msg = decode_in(data)
    assert msg == Relation(
        xid=None,
        oid=16384,
        namespace="public",
        name="accounts",
        replident="f",
        columns=(Column(1, "id", 23, -1), Column(0, "name", 1043, 36)),
    )
    assert isinstance(msg, Relation)
    assert [c.is_key for c in msg.columns] == [True, False]
    assert msg.key_columns == (Column(1, "id", 23, -1),)


def test_relation_in_pg_catalog_has_empty_namespace() -> None:
    msg = decode_in(b"R" + h("00000001") + b"\0" + b"t\0" + b"d" + h("0000"))
    assert msg == Relation(None, 1, "", "t", "d", ())


def test_type() -> None:
    msg = decode_in(b"Y" + h("00008001") + b"public\0" + b"mood\0")
    assert msg == Type(xid=None, oid=0x8001, namespace="public", name="mood")


def test_insert_with_every_column_kind() -> None:
    data = (
        b"I" + h("00004000") + b"N" + h("0004")
        + b"t" + h("00000002") + b"42"
        + b"n"
        + b"u"
        + b"b" + h("00000003") + h("00ff10")
    )  # fmt: skip
    msg = decode_in(data)
    assert isinstance(msg, Insert)
    assert (msg.xid, msg.relation_oid) == (None, 16384)
    assert msg.new.kinds == b"tnub"
    assert msg.new.values == (b"42", None, None, h("00ff10"))
    assert list(msg.new) == [
        (TEXT, b"42"),
        (NULL, None),
        (UNCHANGED_TOAST, None),
        (BINARY, h("00ff10")),
    ]
    assert msg.new.has_unchanged_toast and msg.new.has_binary
    assert msg.new.unchanged_toast_columns() == (2,)
    assert len(msg.new) == 4


def test_insert_all_text_and_empty_value() -> None:
    data = (
        b"I" + h("00000005") + b"N" + h("0002") + b"t" + h("00000000") + b"t" + h("00000001") + b"x"
    )
    msg = decode_in(data)
    assert msg == Insert(None, 5, TupleData(b"tt", (b"", b"x")))
    assert isinstance(msg, Insert) and not msg.new.has_unchanged_toast


def test_insert_with_zero_columns() -> None:
    assert decode_in(b"I" + h("00000005") + b"N" + h("0000")) == Insert(None, 5, TupleData(b"", ()))


def test_update_new_only() -> None:
    data = b"U" + h("00004000") + b"N" + h("0001") + b"t" + h("00000001") + b"7"
    assert decode_in(data) == Update(None, 16384, None, None, TupleData(b"t", (b"7",)))


def test_update_with_key() -> None:
    data = (
        b"U" + h("00004000")
        + b"K" + h("0002") + b"t" + h("00000001") + b"1" + b"n"
        + b"N" + h("0002") + b"t" + h("00000001") + b"2" + b"u"
    )  # fmt: skip
    msg = decode_in(data)
    assert msg == Update(
        None, 16384, TupleData(b"tn", (b"1", None)), "K", TupleData(b"tu", (b"2", None))
    )


def test_update_with_old_row() -> None:
    data = b"U" + h("00000009") + b"O" + h("0000") + b"N" + h("0000")
    assert decode_in(data) == Update(None, 9, TupleData(b"", ()), "O", TupleData(b"", ()))


def test_delete_key_and_old() -> None:
    key = b"D" + h("00004000") + b"K" + h("0001") + b"t" + h("00000002") + b"10"
    assert decode_in(key) == Delete(None, 16384, TupleData(b"t", (b"10",)), "K")
    old = b"D" + h("00004000") + b"O" + h("0001") + b"n"
    assert decode_in(old) == Delete(None, 16384, TupleData(b"n", (None,)), "O")


def test_truncate() -> None:
    msg = decode_in(b"T" + h("00000002") + h("03") + h("00004000") + h("00004001"))
    assert msg == Truncate(xid=None, options=3, relation_oids=(16384, 16385))
    assert isinstance(msg, Truncate) and msg.cascade and msg.restart_identity
    plain = decode_in(b"T" + h("00000001") + h("00") + h("00004000"))
    assert isinstance(plain, Truncate) and not plain.cascade and not plain.restart_identity


def test_message_transactional_and_not() -> None:
    data = b"M" + h("01") + h(LSN_A) + b"app\0" + h("00000003") + b"a\0b"
    assert decode_in(data) == Message(None, True, Lsn(0x16B3748), "app", b"a\0b")
    data = b"M" + h("00") + h(LSN_A) + b"\0" + h("00000000")
    assert decode_in(data) == Message(None, False, Lsn(0x16B3748), "", b"")


def test_stream_start_stop_and_xid_prefix() -> None:
    dec = PgOutputDecoder(2)
    assert dec.decode(b"S" + h(XID) + h("01")) == StreamStart(xid=1234, first_segment=True)
    assert dec.in_stream
    # Inside the block every row message starts with the xid.
    ins = b"I" + h(XID) + h("00004000") + b"N" + h("0001") + b"t" + h("00000001") + b"1"
    assert dec.decode(ins) == Insert(1234, 16384, TupleData(b"t", (b"1",)))
    rel = b"R" + h(XID) + h("00004000") + b"s\0" + b"t\0" + b"i" + h("0000")
    assert dec.decode(rel) == Relation(1234, 16384, "s", "t", "i", ())
    typ = b"Y" + h(XID) + h("00000010") + b"s\0" + b"e\0"
    assert dec.decode(typ) == Type(1234, 16, "s", "e")
    upd = b"U" + h(XID) + h("00000001") + b"N" + h("0000")
    assert dec.decode(upd) == Update(1234, 1, None, None, TupleData(b"", ()))
    dele = b"D" + h(XID) + h("00000001") + b"K" + h("0000")
    assert dec.decode(dele) == Delete(1234, 1, TupleData(b"", ()), "K")
    trunc = b"T" + h(XID) + h("00000001") + h("01") + h("00000001")
    assert dec.decode(trunc) == Truncate(1234, 1, (1,))
    msg = b"M" + h(XID) + h("01") + h(LSN_A) + b"p\0" + h("00000001") + b"x"
    assert dec.decode(msg) == Message(1234, True, Lsn(0x16B3748), "p", b"x")
    assert dec.decode(b"E") == StreamStop()
    assert not dec.in_stream
    assert dec.decode(b"S" + h(XID) + h("00")) == StreamStart(1234, False)


def test_stream_commit() -> None:
    msg = decode_in(b"c" + h(XID) + h("00") + h(LSN_A) + h(LSN_B) + h(TS), proto=2)
    assert msg == StreamCommit(1234, 0, Lsn(0x16B3748), Lsn(0x1_0000_0002), TS_US)
    assert isinstance(msg, StreamCommit) and msg.commit_time.year == 2023


def test_stream_abort_without_and_with_abort_info() -> None:
    short = b"A" + h(XID) + h("000004d3")
    for proto in (2, 3, 4):
        assert decode_in(short, proto=proto) == StreamAbort(1234, 1235, None, None)
    long = short + h(LSN_A) + h(TS)
    msg = decode_in(long, proto=4)
    assert msg == StreamAbort(1234, 1235, Lsn(0x16B3748), TS_US)
    assert isinstance(msg, StreamAbort) and msg.abort_time is not None
    assert PgOutputDecoder(4, streaming_parallel=True).decode(long) == msg


def test_begin_prepare() -> None:
    msg = decode_in(b"b" + h(LSN_A + LSN_B + TS + XID) + b"gid-1\0", proto=3)
    assert msg == BeginPrepare(Lsn(0x16B3748), Lsn(0x1_0000_0002), TS_US, 1234, "gid-1")
    assert isinstance(msg, BeginPrepare) and msg.prepare_time.year == 2023


def test_prepare_commit_prepared_stream_prepare() -> None:
    body = h("00" + LSN_A + LSN_B + TS + XID) + b"g\0"
    args = (0, Lsn(0x16B3748), Lsn(0x1_0000_0002), TS_US, 1234, "g")
    assert decode_in(b"P" + body, proto=3) == Prepare(*args)
    assert decode_in(b"K" + body, proto=3) == CommitPrepared(*args)
    assert decode_in(b"p" + body, proto=3) == StreamPrepare(*args)


def test_rollback_prepared() -> None:
    ts2 = "0000000000000001"
    msg = decode_in(b"r" + h("00" + LSN_A + LSN_B + TS + ts2 + XID) + b"g\0", proto=3)
    assert msg == RollbackPrepared(0, Lsn(0x16B3748), Lsn(0x1_0000_0002), TS_US, 1, 1234, "g")
    assert isinstance(msg, RollbackPrepared)
    assert msg.rollback_time == dt.datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC)


def test_utf8_names() -> None:
    msg = decode_in(b"Y" + h("00000001") + "schéma\0".encode() + "型\0".encode())
    assert msg == Type(None, 1, "schéma", "型")


def test_memoryview_values_come_back_as_bytes() -> None:
    data = b"I" + h("00000001") + b"N" + h("0001") + b"t" + h("00000002") + b"ab"
    msg = PgOutputDecoder().decode(memoryview(data))
    assert isinstance(msg, Insert) and type(msg.new.values[0]) is bytes


def test_kinds_and_tags_are_unique() -> None:
    from applier.protocol import ALL_MESSAGE_TYPES

    assert len({c.kind for c in ALL_MESSAGE_TYPES}) == len(ALL_MESSAGE_TYPES) == 19
    assert len({c.tag for c in ALL_MESSAGE_TYPES}) == 19


def test_encoder_matches_hand_written_bytes() -> None:
    data = b"B" + h(LSN_A + TS + XID)
    assert encode(Begin(Lsn(0x16B3748), TS_US, 1234)) == data
    ins = b"I" + h(XID) + h("00000001") + b"N" + h("0002") + b"n" + b"t" + h("00000001") + b"x"
    assert encode(Insert(1234, 1, TupleData(b"nt", (None, b"x"))), 2, in_stream=True) == ins
