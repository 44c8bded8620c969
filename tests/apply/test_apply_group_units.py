"""Group commit bookkeeping of the Applier against a fake target session (no servers)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from applier.apply.handlers import dispatch as handlers
from applier.apply.handlers import groupcommit
from applier.apply.handlers.dispatch import Applier
from applier.apply.sql.mapping import RelMap, TargetColumn, TargetTable
from applier.config import config_from_dict
from applier.lsn import Lsn
from applier.protocol import Begin, Column, Commit, Insert, Relation, TupleData


class FakeSession:
    def __init__(self) -> None:
        self.in_txn = False
        self.txn_context: dict[str, Any] = {}
        self.on_missing: Any = None
        self.rows: list[bytes | None] = []
        self.commits: list[tuple[int, list[bytes | None]]] = []

    def begin(self) -> None:
        assert not self.in_txn
        self.in_txn = True

    def execute(self, stmt: Any, params: Any, fmts: Any, ctx: Any) -> None:
        assert self.in_txn
        self.rows.append(params[0])

    insert = execute

    def commit(self, end_lsn: Lsn, ts: int, done: Any, wait: bool = False) -> None:
        assert self.in_txn
        self.commits.append((int(end_lsn), self.rows))
        self.rows, self.in_txn = [], False
        done(Lsn(0))

    def rollback(self) -> None:
        self.rows, self.in_txn = [], False

    def settle(self) -> None:
        pass

    def flush_checks(self) -> None:
        """No results to read: nothing here reports a conflict."""


def _applier(limit: int) -> tuple[Applier, FakeSession]:
    cols = (Column(1, "id", 23, -1),)
    rel = Relation(None, 1, "s", "t", "d", cols)
    tcols = {"id": TargetColumn("id", 23, "integer", True, False)}
    rm = RelMap(rel, 7, True, TargetTable(9, "s", "t", "r", tcols), tuple(tcols.values()), (0,))
    cfg = config_from_dict(
        {
            "source": {"dsn": "host=x", "publications": ["p"]},
            "target": {"dsn": "host=y", "origin": "o"},
        }
    )
    session = FakeSession()
    catalog: Any = SimpleNamespace(conn=None)
    a = Applier(cfg, session, catalog, None, Lsn(0), limit)  # type: ignore[arg-type]
    a.relations[1] = rel
    a.relmaps[1] = rm
    return a, session


def _txn(n: int) -> list[Any]:
    """Source transaction n: commit at 100*n, end at 100*n + 10, one row b'n'."""
    return [
        Begin(Lsn(100 * n), 0, n),
        Insert(n, 1, TupleData.text(str(n).encode())),
        Commit(0, Lsn(100 * n), Lsn(100 * n + 10), 0),
    ]


def _run(a: Applier, batch: list[Any]) -> None:
    for m in batch:
        a.dispatch(Lsn(0), m)
    a.commit_group()  # what the worker does after each batch


def test_group_commits_at_batch_end_stamped_with_last_txn() -> None:
    a, s = _applier(100)
    _run(a, _txn(1) + _txn(2) + _txn(3))
    assert s.commits == [(310, [b"1", b"2", b"3"])]
    assert a.applied_txns == 3 and a.progress == 310 and a.group_txns == 0


def test_group_limit_bounds_the_group() -> None:
    a, s = _applier(2)
    _run(a, _txn(1) + _txn(2) + _txn(3))
    assert s.commits == [(210, [b"1", b"2"]), (310, [b"3"])]


def test_batch_ending_inside_a_txn_does_not_commit_its_rows() -> None:
    a, s = _applier(100)
    t2 = _txn(2)
    _run(a, _txn(1) + t2[:2])  # the batch ends after txn 2's row, before its Commit
    assert s.commits == [] and s.in_txn and a.group_txns == 1
    _run(a, t2[2:])
    assert s.commits == [(210, [b"1", b"2"])]


def test_no_group_until_applies_one_by_one() -> None:
    a, s = _applier(100)
    a.no_group_until = Lsn(210)
    _run(a, _txn(1) + _txn(2) + _txn(3) + _txn(4))
    assert s.commits == [(110, [b"1"]), (210, [b"2"]), (410, [b"3", b"4"])]


def _clocked(monkeypatch: Any, step: float) -> None:
    """Each look at the clock is ``step`` seconds after the one before."""
    ticks = iter(range(1_000_000))
    monkeypatch.setattr(handlers, "monotonic", lambda: next(ticks) * step)


def test_a_live_group_closes_at_its_age(monkeypatch: Any) -> None:
    a, s = _applier(100)
    _clocked(monkeypatch, 0.003)  # each transaction ends 3 ms after the one before
    a.sent_at = groupcommit.BEHIND_AFTER - 1  # sent right after its commit (commit_ts 0)
    _run(a, _txn(1) + _txn(2) + _txn(3))
    assert [end for end, _ in s.commits] == [210, 310]


def test_a_group_from_a_backlog_stays_open_longer(monkeypatch: Any) -> None:
    a, s = _applier(100)
    _clocked(monkeypatch, 0.003)
    a.sent_at = groupcommit.BEHIND_AFTER  # sent 100 ms after its commit: from a backlog
    _run(a, [m for n in range(1, 21) for m in _txn(n)])
    ends = [end for end, _ in s.commits]
    # At 3 ms a transaction the 18th finds the group 51 ms old and commits it.
    assert ends == [1810, 2010], ends
