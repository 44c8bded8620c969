"""A target session used as parallel apply uses it: a low bound on results owed,
and the same session going on after a refused COMMIT.

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
from applykit import applier_on_target
from conftest import ONE_PAIR, Pair

from applier.apply.handlers.dispatch import Applier
from applier.errors import ApplyError
from applier.lsn import Lsn
from applier.protocol import Begin, Column, Commit, Insert, Relation, TupleData

ID, V = Column(1, "id", 23, -1), Column(0, "v", 25, -1)
ROWS = 1_500


@pytest.fixture
def applier(pair: Pair, tmp_path: Path) -> Iterator[Applier]:
    pair.sub_exec("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE u (LIKE t)")
    # A silent target fails in 10 s instead of hanging the suite.
    with applier_on_target(pair, tmp_path, timeout=10) as a:
        yield a


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


@ONE_PAIR
def test_a_session_whose_commit_failed_commits_the_next_transaction(
    applier: Applier, pair: Pair
) -> None:
    """A COMMIT the target refuses (a deferred foreign key, its triggers ENABLE ALWAYS
    as in the random mixes) and the session used again, as a parallel member does to
    apply a refused run one transaction at a time: the next transaction's guard must
    expect what the server holds (the last commit that succeeded), not the id of the
    one that failed ("an earlier target transaction of this session did not commit")."""
    pair.sub_exec(
        "CREATE TABLE p (id int PRIMARY KEY);"
        "CREATE TABLE c (id int PRIMARY KEY, pid int REFERENCES p DEFERRABLE INITIALLY DEFERRED);"
        "DO $$ DECLARE r record; BEGIN FOR r IN SELECT tgname FROM pg_catalog.pg_trigger "
        "WHERE tgrelid = 'public.c'::regclass AND tgisinternal LOOP "
        "EXECUTE format('ALTER TABLE public.c ENABLE ALWAYS TRIGGER %I', r.tgname); "
        "END LOOP; END $$"
    )
    pid = Column(0, "pid", 23, -1)
    applier.commit_waits = True
    feed = [
        (Lsn(0x100000), Relation(None, 16402, "public", "c", "d", (ID, pid))),
        (Lsn(0x100000), Relation(None, 16403, "public", "p", "d", (ID,))),
    ]
    for lsn, m in feed:
        applier.dispatch(lsn, m)

    def txn(at: int, oid: int, *values: bytes) -> None:
        lsn = Lsn(at)
        applier.dispatch(lsn, Begin(lsn, 0, at))
        applier.dispatch(lsn, Insert(None, oid, TupleData.text(*values)))
        applier.dispatch(lsn, Commit(0, lsn, Lsn(lsn + 8), 0))

    txn(0x100100, 16403, b"1")  # committed: the guard's chain starts
    with pytest.raises(ApplyError, match="c_pid_fkey"):
        txn(0x100200, 16402, b"1", b"999")  # no parent: refused at COMMIT
    applier.abandon()
    applier.session.forget_failure()
    txn(0x100300, 16403, b"2")
    applier.session.settle()
    assert pair.sub_exec("SELECT id FROM p ORDER BY 1") == [(1,), (2,)]
    assert pair.sub_exec("SELECT count(*) FROM c") == [(0,)]
