"""The capture's key and signature on the real server: its HMAC is Python's, the key
is its owner's, kept by a reinstall, dropped by uninstall, made again when lost."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from ddlkit import Source, role, source_db

from applier.ddl.message import DdlMessage, signature, signed, split
from applier.localpg import LocalCluster


@pytest.fixture
def src(publisher: tuple[LocalCluster, str], tmp_path: Path) -> Iterator[Source]:
    cluster, db = publisher
    with source_db(cluster, db, tmp_path) as s:
        s.install()
        yield s


@pytest.mark.parametrize("key_len", [0, 1, 32, 64, 65, 200])
def test_the_sql_hmac_is_rfc_2104s(src: Source, key_len: int) -> None:
    key = os.urandom(key_len)
    with src.conn() as c:
        for msg in (b"", b"x", os.urandom(63), os.urandom(64), os.urandom(1000)):
            row = c.execute("SELECT applier_ddl.hmac(%s, %s)", (key, msg)).fetchone()
            assert row is not None
            assert bytes(row[0]) == hmac.new(key, msg, hashlib.sha256).digest()


def test_signed_in_sql_is_message_py_s_and_verify_says_so(src: Source) -> None:
    body = DdlMessage("ALTER TABLE", 'ALTER TABLE t ADD "é" int', "public", ()).encode()
    key = src.key()
    assert key is not None
    with src.conn() as c:
        row = c.execute("SELECT applier_ddl.signed(%s)", (body,)).fetchone()
        assert row is not None and bytes(row[0]) == signed(body, key)
        parts = split(bytes(row[0]))
        assert parts == (body, signature(body, key))
    with role(src) as r, psycopg.connect(src.cluster.dsn(src.db, r), autocommit=True) as c:
        # Anyone may ask, nobody but the owner may read the key or sign.
        verify = "SELECT applier_ddl.verify(%s, %s)"
        assert c.execute(verify, (body, signature(body, key))).fetchone() == (True,)
        assert c.execute(verify, (body, signature(body, b"k" * 32))).fetchone() == (False,)
        assert c.execute(verify, (body + b" ", signature(body, key))).fetchone() == (False,)
        for denied in (
            "SELECT k FROM applier_ddl.key",
            "SELECT applier_ddl.secret()",
            "SELECT applier_ddl.signed('{\"v\":1}')",
            'SELECT applier_ddl.emit_run(\'{"via":"run"}\')',
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(denied)


def test_a_reinstall_keeps_the_key_uninstall_drops_it(src: Source) -> None:
    key = src.key()
    assert key is not None and len(key) == 32
    src.install()
    assert src.key() == key
    src.run("CREATE TABLE t (i int)")
    assert [m.statement for m in src.messages()] == ["CREATE TABLE t (i int)"]  # signed: key
    src.quietly("DROP TABLE t")
    from applier.config import load_config
    from applier.ddl import source

    source.uninstall(load_config(src.config()))
    assert src.key() is None
    src.install()
    assert src.key() not in (None, key)


def test_a_lost_key_is_made_again_and_ddl_still_captured(src: Source) -> None:
    """The key's table is unlogged (its row never in the stream): a crash empties it."""
    key = src.key()
    src.quietly("TRUNCATE applier_ddl.key")
    src.run("CREATE TABLE t (i int)")
    assert [m.statement for m in src.messages()] == ["CREATE TABLE t (i int)"]
    assert src.key() not in (None, key)
    src.quietly("DROP TABLE t")
