"""A session's queue of statements awaiting results, bounded low, does not hang.

Parallel apply's leader keeps its own session's queue short while the target is
what limits apply (``max_inflight`` 256 instead of 20,000: applier.apply.parallel.
leader, INLINE_INFLIGHT). The server holds small results back until a Flush or
Sync, so a client that only waits for results once it is over its bound waits
forever (found so: the leader's session was silent for 60 s, its backend waiting
on ClientRead). The session must ask for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ONE_PAIR, Pair

from applier.apply.handlers.dispatch import Applier
from applier.apply.handlers.spool import SpoolSet
from applier.apply.sql.mapping import Catalog
from applier.apply.target.origin import ensure_origin
from applier.apply.target.session import TargetSession
from applier.lsn import Lsn
from applier.protocol import Begin, Column, Commit, Insert, Relation, TupleData
from applier.schema import upgrade_target

ID, V = Column(1, "id", 23, -1), Column(0, "v", 25, -1)
ROWS = 1_500


@pytest.fixture
def applier(pair: Pair, tmp_path: Path) -> Iterator[Applier]:
    pair.sub_exec("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE u (LIKE t)")
    cfg = pair.config()
    conn = pair.sub_conn(autocommit=True)
    ensure_origin(conn, cfg.origin)
    upgrade_target(pair.sub_dsn)
    # A silent target fails in 10 s instead of hanging the suite.
    session = TargetSession(pair.sub_dsn, cfg.origin, "on", timeout=10)
    a = Applier(cfg, session, Catalog(conn), SpoolSet(tmp_path, "d", 1 << 20), Lsn(0))
    try:
        yield a
    finally:
        a.abandon()
        session.close()
        conn.close()


@ONE_PAIR
@pytest.mark.parametrize("depth", [1, 16, 256])
def test_a_low_bound_on_results_owed_does_not_hang(
    applier: Applier, pair: Pair, depth: int
) -> None:
    applier.session.max_inflight = depth
    at = Lsn(0x100000)
    applier.dispatch(at, Relation(None, 16400, "public", "t", "d", (ID, V)))
    applier.dispatch(at, Relation(None, 16401, "public", "u", "d", (ID, V)))
    applier.dispatch(at, Begin(at, 0, 1000))
    for i in range(ROWS):  # alternating tables: no run of INSERTs, one statement each
        for oid in (16400, 16401):
            applier.dispatch(at, Insert(None, oid, TupleData.text(str(i).encode(), b"x")))
    applier.dispatch(at, Commit(0, at, Lsn(at + 8), 0))
    applier.commit_group()
    applier.session.settle()
    assert pair.sub_exec("SELECT count(*) FROM t")[0][0] == ROWS
    assert pair.sub_exec("SELECT count(*) FROM u")[0][0] == ROWS
