"""Only applier's capture writes what the worker runs: a forged ``applier.ddl`` message.

Any source role that may call ``pg_logical_emit_message`` (``PUBLIC`` may, by
default) can write a message of applier's prefix inside its own transaction. The
worker must not run it with the target role's privileges: it stops (exit 3)
naming the LSN and xid, and ``applier skip add --ddl-lsn`` skips it.
"""

from __future__ import annotations

import os
import re
import uuid

import psycopg
import pytest
from applykit import Runner, wait_equal, wait_for
from conftest import Pair
from test_apply_ddl_replay import _cli

from applier.ddl.message import DdlMessage, DdlObject, signed

FORGERIES = {
    "unsigned": ("it carries no signature", True),
    "another key": ("its signature is not the source's key's", True),
    "no capture": ("the source has no applier_ddl.verify: applier ddl install is not there", False),
}


@pytest.mark.parametrize(
    ("pair", "forgery"),
    [("15-18", "unsigned"), ("18-18", "unsigned"), ("18-18", "another key"),
     ("15-18", "no capture")],
    indirect=["pair"],
)  # fmt: skip
def test_a_message_forged_by_an_unprivileged_role_is_not_run(pair: Pair, forgery: str) -> None:
    why, install = FORGERIES[forgery]
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    if install:
        installed = _cli("ddl", "install", "--config", str(cfg))
        assert installed.returncode == 0, installed.stderr
    # An application role: LOGIN, may write rows of t, owns nothing, no superuser.
    role = f"app_{uuid.uuid4().hex[:8]}"
    pair.pub_exec(f"CREATE ROLE {role} LOGIN; GRANT INSERT ON t TO {role}")
    runner = Runner(pair, cfg, "forged.log").start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1)")
    wait_equal(pair, ["t"], runner=runner)
    forged = DdlMessage("DROP TABLE", "DROP TABLE public.t", "public",
                        (DdlObject("table", "public", "public.t", dropped=True),))  # fmt: skip
    content = forged.encode()
    if forgery != "unsigned":
        content = signed(content, os.urandom(32))  # a guessed key
    with psycopg.connect(pair.pub.dsn(pair.pub_db, role)) as conn:
        conn.execute("INSERT INTO t VALUES (2)")
        conn.execute(
            "SELECT pg_catalog.pg_logical_emit_message(true, 'applier.ddl', %s::bytea)",
            (content,),
        )
        conn.commit()
    has_t = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = 't'"
    wait_for(lambda: not runner.alive() or pair.sub_exec(has_t) == [(0,)], 90, "a stop")
    assert pair.sub_exec(has_t) == [(1,)], "the forged DROP TABLE ran on the target"
    assert runner.wait(60) == 3, runner.log()[-3000:]
    log = runner.log()
    assert f"not written by applier's capture ({why})" in log, log[-3000:]
    found = re.search(rf"applier skip add --config {re.escape(str(cfg))} --ddl-lsn (\S+)", log)
    assert found is not None, log[-3000:]
    assert re.search(r"xid\W+\d+", log), log[-3000:]
    assert pair.sub_exec("SELECT id FROM t ORDER BY id") == [(1,)]
    skip = _cli("skip", "add", "--config", str(cfg), "--ddl-lsn", found.group(1).rstrip(")"))
    assert skip.returncode == 0, skip.stderr
    runner = Runner(pair, cfg, "after.log").start().ready()
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    assert pair.sub_exec("SELECT id FROM t ORDER BY id") == [(1,), (2,)]
    kept = pair.sub_exec("SELECT op, statement FROM applier.skipped_changes")
    assert kept == [("ddl", "DROP TABLE public.t")], kept
