"""Thousands of Relation changes keep the apply backend's prepared statements and the
worker's memory bounded (issue 12, item 10).

The messages go through the real Applier and its TargetSession on a real target;
``pg_prepared_statements`` is read on the apply session's own backend.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from applykit import applier_on_target
from conftest import ONE_PAIR, Pair

from applier.apply.handlers.dispatch import Applier
from applier.lsn import Lsn
from applier.protocol import Begin, Column, Commit, Insert, PgOutputMessage, Relation, TupleData

#: Target tables the "partitions" (new relation OIDs) map to.
TABLES = 20
ID, V, W = Column(1, "id", 23, -1), Column(0, "v", 25, -1), Column(0, "w", 23, -1)


@pytest.fixture
def applier(pair: Pair, tmp_path: Path) -> Iterator[Applier]:
    pair.sub_exec("CREATE TABLE t (id int PRIMARY KEY, v text, w int)")
    pair.sub_exec(
        "".join(f"CREATE TABLE part{i} (id int PRIMARY KEY, v text);" for i in range(TABLES))
    )
    with applier_on_target(pair, tmp_path) as a:
        yield a


class Feed:
    def __init__(self, a: Applier) -> None:
        self.a = a
        self.lsn = 0x100000
        self.xid = 1000

    def txn(self, msgs: list[PgOutputMessage]) -> None:
        self.lsn += 0x100
        self.xid += 1
        a = self.a
        a.dispatch(Lsn(self.lsn), Begin(Lsn(self.lsn), 0, self.xid))
        for m in msgs:
            a.dispatch(Lsn(self.lsn), m)
        a.dispatch(Lsn(self.lsn), Commit(0, Lsn(self.lsn), Lsn(self.lsn + 8), 0))
        a.commit_group()


def _statements(a: Applier) -> int:
    return int(a.session.query_one("SELECT count(*) FROM pg_catalog.pg_prepared_statements"))


def _cycle(feed: Feed, i: int) -> None:
    """One ALTER TABLE on the source (t gains or loses w) and one new partition."""
    shape = (ID, V, W) if i % 2 else (ID, V)
    values = (str(i).encode(), b"x", b"1")[: len(shape)]
    alter = Relation(None, 16400, "public", "t", "d", shape)
    part_oid = 20000 + i
    part = Relation(None, part_oid, "public", f"part{i % TABLES}", "d", (ID, V))
    feed.txn(
        [
            alter,
            Insert(None, 16400, TupleData.text(*values)),
            part,
            Insert(None, part_oid, TupleData.text(str(i).encode(), b"p")),
        ]
    )
    # The partition is dropped (its rows go with it, as DROP TABLE would).
    feed.a.session.query_one(f"DELETE FROM public.part{i % TABLES} RETURNING 1")


@ONE_PAIR
def test_relation_changes_keep_statements_and_memory_bounded(applier: Applier) -> None:
    feed = Feed(applier)
    applier.rels.limit = 200  # the default is 1000; a smaller bound keeps this quick
    proc = psutil.Process()
    for i in range(600):
        _cycle(feed, i)
    gc.collect()
    statements, rss = _statements(applier), proc.memory_info().rss
    for i in range(600, 1800):
        _cycle(feed, i)
    gc.collect()
    # 3600 Relation changes: the statements of the live mappings only.
    assert _statements(applier) <= statements + 10 <= 300, (statements, _statements(applier))
    assert len(applier.relmaps) <= 200
    assert len(applier.planner.cache) <= 300
    assert proc.memory_info().rss - rss < 20 * 1024 * 1024
    assert applier.session.query_one("SELECT count(*) FROM public.t") == 1800


@ONE_PAIR
def test_unchanged_relation_message_keeps_its_mapping(applier: Applier) -> None:
    feed = Feed(applier)
    rel = Relation(None, 16400, "public", "t", "d", (ID, V))
    feed.txn([rel, Insert(None, 16400, TupleData.text(b"1", b"a"))])
    first = applier.relmaps[16400]
    feed.txn([rel, Insert(None, 16400, TupleData.text(b"2", b"b"))])
    assert applier.relmaps[16400] is first
    assert _statements(applier) == 1
