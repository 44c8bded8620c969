"""The applier.ddl message format: what the writers encode, the worker decodes."""

from __future__ import annotations

import pytest

from applier.ddl.message import DdlMessage, DdlObject, decode, signature, signed, split
from applier.errors import ProtocolError


def test_round_trip_keeps_every_field() -> None:
    m = DdlMessage(
        tag="ALTER TABLE",
        statement='ALTER TABLE t ADD COLUMN "é" int DEFAULT 1; -- ünïcode',
        search_path='"$user", public',
        objects=(
            DdlObject("table", "public", "public.t"),
            DdlObject("table column", "public", "public.t.x", dropped=True),
        ),
        via="run",
        subxact=4242,
    )
    back = decode(m.encode())
    assert back == m
    assert back.subxact == 4242  # not compared by ==: where it was written, not what it is


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"not json", "unreadable applier.ddl message"),
        (b'{"v": 2, "tag": "X", "statement": "", "search_path": ""}', "format version 2"),
        (b'{"v": 1, "statement": "", "search_path": ""}', "'tag' missing"),
        (b'{"v": 1, "tag": "X", "statement": "", "search_path": "", "via": "x"}', "via 'x'"),
        (b'{"v": 1, "tag": "X", "statement": "", "search_path": "", "objects": [1]}', "object"),
        (b'{"v": 1, "tag": "X", "statement": "", "search_path": "", "subxact": "7"}', "subxact"),
    ],
)
def test_malformed_content_is_a_clear_error(content: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says) as e:
        decode(content, lsn="0/16B3748")
    assert "skip add --ddl-lsn 0/16B3748" in str(e.value)


def test_signed_content_is_json_with_sig_first_and_splits_back() -> None:
    body = DdlMessage("CREATE TABLE", "CREATE TABLE t ()", "public", ()).encode()
    key = bytes(range(32))
    content = signed(body, key)
    assert content.startswith(b'{"sig":"' + signature(body, key).encode() + b'",')
    assert split(content) == (body, signature(body, key))
    assert decode(content) == decode(body)  # the reader skips the key it does not need


@pytest.mark.parametrize(
    "content",
    [
        b'{"v":1,"tag":"X"}',  # unsigned
        b'{"sig":"abc","v":1}',  # not 64 hex digits
        b'{"sig":"' + b"A" * 64 + b'","v":1}',  # upper case: not what a writer writes
        b' {"sig":"' + b"0" * 64 + b'","v":1}',  # not at the very start
    ],
)
def test_content_not_signed_the_one_way_does_not_split(content: bytes) -> None:
    assert split(content) is None
