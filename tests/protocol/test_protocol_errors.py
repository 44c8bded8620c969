"""Every kind of bad input raises DecodeError naming the message type and the byte offset."""

from __future__ import annotations

import pytest
from protocol_helpers import decoder_for

from applier.errors import DecodeError
from applier.protocol import PgOutputDecoder, StreamStart, encode

h = bytes.fromhex
LSN = "00000000016b3748"
TS = "0002942748d56000"
XID = "000004d2"
INS = b"I" + h("00004000") + b"N"  # insert header, tuple follows at offset 6
REL = b"R" + h("00000001") + b"s\0t\0d"  # relation header up to ncols (offset 10)
PREP = h("00" + LSN + LSN + TS + XID)  # Prepare-like body before the gid (29 bytes)

# (id, proto, in_stream, bytes, msg_type, offset)
CASES = [
    ("empty", 1, False, b"", None, 0),
    ("unknown tag", 1, False, b"Z123", "Z", 0),
    ("unprintable tag", 1, False, b"\x00", "0x00", 0),
    ("begin cut in commit_ts", 1, False, b"B" + h(LSN) + h("0000"), "B", 9),
    ("begin cut in xid", 1, False, b"B" + h(LSN + TS) + h("00"), "B", 17),
    ("begin trailing", 1, False, b"B" + h(LSN + TS + XID) + b"x", "B", 21),
    ("commit flags", 1, False, b"C" + h("01" + LSN + LSN + TS), "C", 1),
    ("commit cut", 1, False, b"C" + h("00" + LSN), "C", 10),
    ("origin no NUL", 1, False, b"O" + h(LSN) + b"abc", "O", 9),
    ("origin bad utf8", 1, False, b"O" + h(LSN) + b"ab\xff\0", "O", 11),
    ("origin trailing", 1, False, b"O" + h(LSN) + b"a\0z", "O", 11),
    ("origin cut lsn", 1, False, b"O" + h("0000"), "O", 1),
    ("relation cut oid", 1, False, b"R" + h("0000"), "R", 1),
    ("relation no NUL", 1, False, b"R" + h("00000001") + b"public", "R", 5),
    ("relation replident", 1, False, b"R" + h("00000001") + b"s\0t\0x" + h("0000"), "R", 9),
    ("relation cut ncols", 1, False, REL + h("00"), "R", 10),
    ("relation col flags", 1, False, REL + h("0001") + h("02"), "R", 12),
    ("relation col missing", 1, False, REL + h("0001"), "R", 12),
    ("relation col cut typmod", 1, False,
     REL + h("0001") + h("00") + b"c\0" + h("00000017"), "R", 19),
    ("relation trailing", 1, False, REL + h("0000") + b"!", "R", 12),
    ("type bad utf8", 1, False, b"Y" + h("00000001") + b"\xc3\0n\0", "Y", 5),
    ("type trailing", 1, False, b"Y" + h("00000001") + b"\0n\0!", "Y", 8),
    ("insert cut relid", 1, False, b"I" + h("0000"), "I", 1),
    ("insert no marker", 1, False, b"I" + h("00004000"), "I", 5),
    ("insert bad marker", 1, False, b"I" + h("00004000") + b"K" + h("0000"), "I", 5),
    ("insert cut ncols", 1, False, INS + h("00"), "I", 6),
    ("insert no ncols", 1, False, INS, "I", 6),
    ("insert missing column", 1, False, INS + h("0002") + b"n", "I", 9),
    ("insert unknown kind", 1, False, INS + h("0002") + b"n" + b"x", "I", 9),
    ("insert cut length", 1, False, INS + h("0001") + b"t" + h("0000"), "I", 9),
    ("insert value too long", 1, False, INS + h("0001") + b"t" + h("00000005") + b"abc", "I", 9),
    ("insert huge length", 1, False, INS + h("0002") + b"t" + h("ffffffff") + b"n", "I", 9),
    ("insert trailing", 1, False, INS + h("0001") + b"n" + b"\0", "I", 9),
    ("insert in stream cut xid", 2, True, b"I" + h("0000"), "I", 1),
    ("update bad marker", 1, False, b"U" + h("00000001") + b"X" + h("0000"), "U", 5),
    ("update key no new", 1, False, b"U" + h("00000001") + b"K" + h("0000"), "U", 8),
    ("update key then K", 1, False, b"U" + h("00000001") + b"K" + h("0000") * 2, "U", 8),
    ("update trailing", 1, False, b"U" + h("00000001") + b"N" + h("0000") + b"x", "U", 8),
    ("update bad old tuple", 1, False, b"U" + h("00000001") + b"O" + h("0001") + b"q", "U", 8),
    ("delete N marker", 1, False, b"D" + h("00000001") + b"N" + h("0000"), "D", 5),
    ("delete trailing", 1, False, b"D" + h("00000001") + b"K" + h("0000") + b"x", "D", 8),
    ("truncate options", 1, False, b"T" + h("00000001") + h("04") + h("00000001"), "T", 5),
    ("truncate missing oid", 1, False, b"T" + h("00000002") + h("00") + h("00000001"), "T", 10),
    ("truncate trailing", 1, False, b"T" + h("00000001") + h("00") + h("0000000100"), "T", 10),
    ("truncate cut header", 1, False, b"T" + h("00000001"), "T", 5),
    ("message flags", 1, False, b"M" + h("02" + LSN) + b"\0" + h("00000000"), "M", 1),
    ("message content cut", 1, False, b"M" + h("01" + LSN) + b"p\0" + h("00000004ffff"), "M", 12),
    ("message cut length", 1, False, b"M" + h("01" + LSN) + b"p\0" + h("0000"), "M", 12),
    ("message trailing", 1, False, b"M" + h("01" + LSN) + b"p\0" + h("00000000") + b"x", "M", 16),
    ("stream start at v1", 1, False, b"S" + h(XID + "01"), "S", 0),
    ("stream stop at v1", 1, False, b"E", "E", 0),
    ("stream commit at v1", 1, False, b"c" + h(XID + "00" + LSN + LSN + TS), "c", 0),
    ("stream abort at v1", 1, False, b"A" + h(XID + XID), "A", 0),
    ("stream start bad first", 2, False, b"S" + h(XID + "02"), "S", 5),
    ("stream start cut", 2, False, b"S" + h(XID), "S", 5),
    ("stream start nested", 2, True, b"S" + h(XID + "01"), "S", 0),
    ("stream stop outside", 2, False, b"E", "E", 0),
    ("stream stop trailing", 2, True, b"Ex", "E", 1),
    ("stream commit in stream", 2, True, b"c" + h(XID + "00" + LSN + LSN + TS), "c", 0),
    ("stream commit flags", 2, False, b"c" + h(XID + "01" + LSN + LSN + TS), "c", 5),
    ("stream abort in stream", 2, True, b"A" + h(XID + XID), "A", 0),
    ("stream abort v2 long", 2, False, b"A" + h(XID + XID + LSN + TS), "A", 9),
    ("stream abort v4 cut ts", 4, False, b"A" + h(XID + XID + LSN + "00"), "A", 17),
    ("stream abort v4 trailing", 4, False, b"A" + h(XID + XID + LSN + TS) + b"x", "A", 25),
    ("stream abort cut", 2, False, b"A" + h(XID), "A", 5),
    ("begin prepare at v2", 2, False, b"b" + h(LSN + LSN + TS + XID) + b"g\0", "b", 0),
    ("prepare at v2", 2, False, b"P" + PREP + b"g\0", "P", 0),
    ("begin prepare cut xid", 3, False, b"b" + h(LSN + LSN + TS), "b", 25),
    ("begin prepare no gid NUL", 3, False, b"b" + h(LSN + LSN + TS + XID) + b"g", "b", 29),
    ("prepare flags", 3, False, b"P" + h("01") + PREP[1:] + b"g\0", "P", 1),
    ("prepare trailing", 3, False, b"P" + PREP + b"g\0x", "P", 32),
    ("commit prepared bad gid", 3, False, b"K" + PREP + b"\xff\0", "K", 30),
    ("stream prepare in stream", 3, True, b"p" + PREP + b"g\0", "p", 0),
    ("rollback prepared flags", 3, False, b"r" + h("02" + LSN * 2 + TS * 2 + XID) + b"g\0", "r", 1),
    ("rollback prepared cut", 3, False, b"r" + h("00" + LSN + LSN + TS), "r", 26),
]  # fmt: skip


@pytest.mark.parametrize(
    ("proto", "in_stream", "data", "msg_type", "offset"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_bad_input_raises_decode_error(
    proto: int, in_stream: bool, data: bytes, msg_type: str | None, offset: int
) -> None:
    dec = decoder_for(proto, in_stream)
    with pytest.raises(DecodeError) as info:
        dec.decode(data)
    assert (info.value.msg_type, info.value.offset) == (msg_type, offset), str(info.value)
    # A failed message never changes the stream state.
    assert dec.in_stream == in_stream


def test_error_text_names_the_message_and_field() -> None:
    with pytest.raises(DecodeError) as info:
        PgOutputDecoder().decode(b"B" + h(LSN) + h("0000"))
    text = str(info.value)
    assert "Begin message" in text and "commit_ts" in text and "offset=9" in text


def test_streaming_parallel_false_refuses_abort_info() -> None:
    dec = PgOutputDecoder(4, streaming_parallel=False)
    with pytest.raises(DecodeError) as info:
        dec.decode(b"A" + h(XID + XID + LSN + TS))
    assert info.value.offset == 9


def test_streaming_parallel_true_needs_abort_info() -> None:
    dec = PgOutputDecoder(4, streaming_parallel=True)
    with pytest.raises(DecodeError) as info:
        dec.decode(b"A" + h(XID + XID))
    assert info.value.offset == 9


def test_reset_leaves_the_stream_block() -> None:
    dec = PgOutputDecoder(2)
    dec.decode(encode(StreamStart(7, True), 2))
    dec.reset()
    assert not dec.in_stream


def test_unsupported_proto_version() -> None:
    with pytest.raises(ValueError):
        PgOutputDecoder(5)
