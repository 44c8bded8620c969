"""The slot is confirmed from the target's flush position without a round trip per
batch while applying (applier.apply.confirm).

Each pipelined commit's result carries the target's WAL flush position; while
batches keep coming, the confirmer releases commits with it, and asks the target
itself only when idle or at most once a second. A synchronous query per 0.1 s held
the apply loop up to ~10 ms each on a busy 2-core machine (the catalog backend
waits for a CPU), about a tenth of a 20,000-transaction pgbench drain.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from conftest import ONE_PAIR, Pair

from applier.apply.confirm import Confirmer
from applier.apply.core.states import State
from applier.apply.target.origin import FlushTracker
from applier.apply.target.session import TargetSession
from applier.lsn import Lsn, now_pg_timestamp
from applier.schema import upgrade_target
from applier.synctables.copy import drop_origin


class _Stream:
    """The two things the confirmer reads and writes on the stream."""

    def __init__(self) -> None:
        self.last_received = Lsn(0x9000000)
        self.confirmed: list[Lsn] = []

    def confirm(self, lsn: Lsn) -> None:
        self.confirmed.append(Lsn(lsn))


def _commit(session: TargetSession, end_lsn: int, row: int, locals_: list[Lsn]) -> None:
    session.begin()
    session.execute_sql(f"INSERT INTO public.t VALUES ({row})".encode(), "insert")
    session.commit(Lsn(end_lsn), now_pg_timestamp(), locals_.append)
    session.settle()


@pytest.fixture
def session(pair: Pair) -> Any:
    origin = f"confirm_{pair.sub_db}"  # origins are per cluster, shared by the tests
    upgrade_target(pair.sub_dsn)
    pair.sub_exec(f"CREATE TABLE t (id int); SELECT pg_replication_origin_create('{origin}')")
    s = TargetSession(pair.sub_dsn, origin, "off")
    yield s
    s.close()
    # Its backend lets go of the origin only when it exits, a moment after the close:
    # dropped at once, a loaded machine failed the teardown with 55006.
    with pair.sub_conn() as conn:
        drop_origin(conn, origin)


@ONE_PAIR
def test_busy_confirm_releases_from_commit_results_without_a_query(
    pair: Pair, session: TargetSession
) -> None:
    locals_: list[Lsn] = []
    _commit(session, 0x5000000, 1, locals_)
    pair.sub_exec("CHECKPOINT")  # the target's WAL is flushed past the first commit
    _commit(session, 0x6000000, 2, locals_)
    assert session.flushed_seen >= locals_[0] > 0
    flush = FlushTracker()
    flush.resolve(flush.store_pending(Lsn(0x5000000)), locals_[0])
    flush.resolve(flush.store_pending(Lsn(0x6000000)), locals_[1])
    applier: Any = SimpleNamespace(flush=flush, state=State.TXN, session=session)
    stream = _Stream()
    closed = psycopg.connect(pair.sub_dsn)
    closed.close()  # any query on it fails: a busy confirm must not ask the target
    confirmer = Confirmer()
    confirmer._checked = time.monotonic()  # it asked a moment ago
    confirmer.confirm(stream, applier, closed, busy=True)
    assert stream.confirmed == [Lsn(0x5000000)]
    # Idle, the second commit is released by asking the target, as before.
    pair.sub_exec("CHECKPOINT")
    with psycopg.connect(pair.sub_dsn, autocommit=True) as catalog:
        Confirmer().confirm(stream, applier, catalog)
    assert stream.confirmed[-1] == Lsn(0x6000000) and not flush.pending


@ONE_PAIR
def test_busy_confirm_still_asks_the_target_once_a_second(
    pair: Pair, session: TargetSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long transaction in hand makes no commits: its predecessors' positions are
    released by asking, at the busy interval."""
    from applier.apply import confirm

    locals_: list[Lsn] = []
    _commit(session, 0x5000000, 1, locals_)
    pair.sub_exec("CHECKPOINT")
    flush = FlushTracker()
    flush.resolve(flush.store_pending(Lsn(0x5000000)), locals_[0])
    applier: Any = SimpleNamespace(flush=flush, state=State.TXN, session=session)
    stream = _Stream()
    clock = [100.0]
    monkeypatch.setattr(confirm.time, "monotonic", lambda: clock[0])
    confirmer = Confirmer()
    with psycopg.connect(pair.sub_dsn, autocommit=True) as catalog:
        confirmer._checked = clock[0]
        session.flushed_seen = Lsn(0)  # as if no commit result had come since
        clock[0] += confirm.FLUSH_CHECK_INTERVAL * 2
        confirmer.confirm(stream, applier, catalog, busy=True)
        assert flush.pending  # busy, and not yet a second since the last look
        clock[0] += confirm.FLUSH_CHECK_BUSY
        confirmer.confirm(stream, applier, catalog, busy=True)
        assert not flush.pending and stream.confirmed[-1] == Lsn(0x5000000)
