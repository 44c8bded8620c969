"""One decision of the paths a change may take (applier.apply.batching.paths), obeyed by every path.

The unit tests check the decision from its inputs and when it is made again, and
that ``hold_update`` stops holding a table's UPDATEs, rows held already, once a
rule there says row by row (the lane itself obeys, not only the path before it). The
test on a real pair adds a new kind of rule in that one place (a rule of
:data:`~applier.apply.batching.paths.ROW_BY_ROW`, loaded into ``applier run`` by a
``sitecustomize`` module) that sends the changes of the tables named ``slow_*``
row by row, and runs through every fast path at once: a transaction of INSERTs
(multi-row INSERTs, a COPY run, the insert lane), a streamed one (the copy lane),
UPDATEs merged per key (``hold_update``, the merge lane) and REPLICA IDENTITY FULL
changes (the FULL identity batch). The target's pg_stat_statements must show one
row per statement for every ``slow_*`` statement, while the same changes of the
``fast_*`` tables took the batched paths (else the test would prove nothing).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from applykit import Runner, wait_equal
from conftest import Pair
from test_update_fast_path import _applier as _applier_of_fast_path
from test_update_fast_path import _messages

from applier.apply.batching import mergelane, paths
from applier.apply.batching.paths import ROW_BY_ROW_ONLY, Paths, decide, paths_of, refresh


def _rm(**kw: Any) -> Any:
    base = dict(
        included=True, policy=None, merge=True, full_batch=False, version=7,
        relation=SimpleNamespace(oid=42, name="t"),
    )  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def _applier(**kw: Any) -> Any:
    a = SimpleNamespace(
        careful=False,
        merging=True,
        session=SimpleNamespace(multi_row=True),
        rules=SimpleNamespace(has_object=False, generation=0),
        syncs=SimpleNamespace(cut={}, generation=0),
        paths={},
        paths_stamp=((), -1, -1),
    )
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def _txn(**kw: Any) -> Any:
    return SimpleNamespace(**{"skip": False, "rule": None, "seen": None, **kw})


ALL = Paths(
    runs=True, copy_lane=True, insert_lane=True, merged=True, full=False, merge_lane=True
)  # fmt: skip


def test_decision_from_each_input() -> None:
    a, rm, txn = _applier(), _rm(), _txn()
    assert decide(a, rm, txn) == ALL
    assert decide(_applier(careful=True), rm, txn) is ROW_BY_ROW_ONLY
    # Inputs the handlers judge per change: no lane, the batched paths stay.
    handlers = Paths(True, False, False, True, False, False)
    assert decide(_applier(rules=SimpleNamespace(has_object=True)), rm, txn) == handlers
    assert decide(_applier(syncs=SimpleNamespace(cut={42: 1})), rm, txn) == handlers
    assert decide(a, rm, _txn(seen=[])) == handlers
    assert decide(a, rm, _txn(rule=object())) == handlers
    assert decide(a, rm, _txn(skip=True)) == handlers
    assert decide(a, _rm(included=False), txn) == handlers
    # One by one: not merged, no multi-row INSERT through the lane (a COPY run may be).
    one = decide(_applier(merging=False, session=SimpleNamespace(multi_row=False)), rm, txn)
    assert one == Paths(True, True, False, False, False, False)
    checked = SimpleNamespace(checked_insert=True)
    assert decide(a, _rm(policy=checked, merge=False), txn) == Paths(
        True, False, False, False, False, False
    )
    unchecked = SimpleNamespace(checked_insert=False)
    assert decide(a, _rm(policy=unchecked), txn) == Paths(True, True, True, True, False, False)
    full = decide(a, _rm(merge=False, full_batch=True), txn)
    assert full == Paths(True, True, True, False, True, False)


def test_a_new_rule_sends_every_path_row_by_row() -> None:
    a, txn = _applier(), _txn()
    paths.ROW_BY_ROW.append(lambda applier, rm, t: rm.relation.name == "slow")
    try:
        assert decide(a, _rm(relation=SimpleNamespace(oid=1, name="slow")), txn) is ROW_BY_ROW_ONLY
        assert decide(a, _rm(), txn) == ALL
    finally:
        paths.ROW_BY_ROW.pop()


def test_decided_once_per_mapping_until_an_input_changes() -> None:
    a, rm, txn = _applier(), _rm(), _txn()
    refresh(a, txn)
    p = paths_of(a, rm, txn)
    assert p == ALL and paths_of(a, rm, txn) is p
    refresh(a, _txn())  # another transaction with the same inputs: kept
    refresh(a)  # between batches, nothing reloaded: kept
    assert a.paths == {7: p}
    a.rules = SimpleNamespace(has_object=True, generation=1)  # reloaded
    refresh(a)
    assert a.paths == {}
    assert paths_of(a, rm, txn).copy_lane is False
    a.syncs = SimpleNamespace(cut={}, generation=1)
    refresh(a)
    assert a.paths == {}
    paths_of(a, rm, txn)
    a.careful = True  # a careful replay starts with the next transaction
    refresh(a, txn)
    assert a.paths == {} and paths_of(a, rm, txn) is ROW_BY_ROW_ONLY
    a.careful = False
    skipped = _txn()
    refresh(a, skipped)
    paths_of(a, rm, skipped)
    skipped.skip = True  # an Origin message: not applied
    refresh(a, skipped)
    assert a.paths == {}


def _updates(rule: bool) -> list[Any]:
    """One transaction of six UPDATEs of table t1, in two batches; between them, the
    decision is made again (as after a reload) with or without a rule for t1."""
    a, session = _applier_of_fast_path()
    msgs = _messages([(False, [("update", 0, k, 1, -1, -1) for k in range(6)])])
    for lsn, msg in msgs[:4]:  # Begin and three UPDATEs: held, merged
        a.dispatch(lsn, msg)
    assert a.merger.holds(1)
    if rule:
        paths.ROW_BY_ROW.append(lambda applier, rm, t: rm.relation.name == "t1")
    try:
        a.paths.clear()
        held = [mergelane.hold_update(a, lsn, msg) for lsn, msg in msgs[4:7]]
        assert held == ([mergelane.NOT_HELD] * 3 if rule else [mergelane.HELD] * 3)
        if rule:
            for lsn, msg in msgs[4:]:
                a.dispatch(lsn, msg)
        else:
            a.dispatch(*msgs[-1])
        a.commit_group()
    finally:
        if rule:
            paths.ROW_BY_ROW.pop()
    # Per statement: how many changes, and whether merged (a VALUES list of rows).
    return [(len(sent[3]), b"(VALUES" in sent[0]) for sent in session.sent if sent[0] != "COMMIT"]


def test_a_new_rule_stops_the_update_fast_path_of_a_table_holding_rows() -> None:
    """The table holds merged UPDATEs when the rule comes: ``hold_update`` (the lane
    for decoded UPDATEs) no longer takes its UPDATEs, the held ones go first, then
    one statement per change."""
    assert _updates(rule=False) == [(4, True), (2, True)]
    assert _updates(rule=True) == [(2, True), (1, True), (1, False), (1, False), (1, False)]


# -- on a real pair ------------------------------------------------------------------------

_RULE = """\
from applier.apply.batching import paths

paths.ROW_BY_ROW.append(lambda applier, rm, txn: rm.relation.name.startswith("slow_"))
"""

_TABLES = "".join(
    f"CREATE TABLE {p}_k (id int PRIMARY KEY, v text);"
    f"CREATE TABLE {p}_f (a int, b text); ALTER TABLE {p}_f REPLICA IDENTITY FULL;"
    for p in ("fast", "slow")
)


def _each(sql: str) -> str:
    return "".join(sql.format(p=p) for p in ("fast", "slow"))


def _dml(pair: Pair, prefix: str) -> list[tuple[str, int, int]]:
    """The target's INSERT, UPDATE, DELETE and COPY statements of ``prefix`` tables:
    (query, calls, rows)."""
    rows = pair.sub_exec(
        "SELECT query, calls, rows FROM public.pg_stat_statements "
        f"WHERE query ~* '^\\s*(INSERT|UPDATE|DELETE|COPY|WITH)' AND query LIKE '%{prefix}\\_%'"
    )
    return [(str(q), int(c), int(r)) for q, c, r in rows]


def test_a_new_rule_sends_every_lane_row_by_row(make_pair: Any, tmp_path: Path) -> None:
    pair = make_pair(15, 15, sub_settings={"shared_preload_libraries": "pg_stat_statements"})
    pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")
    pair.both(_TABLES)
    pair.sub_exec("CREATE EXTENSION pg_stat_statements")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_RULE)
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    cfg = pair.write_config(apply={"streaming": "parallel", "copy_threshold": 64})
    runner = Runner(pair, cfg, env=env).start().ready()
    pair.sub_exec("SELECT public.pg_stat_statements_reset()")
    # Not streamed (under 64kB): runs of INSERTs, held, then a COPY; the insert lane.
    pair.pub_exec(
        "BEGIN;"
        + _each("INSERT INTO {p}_k SELECT g, 'v' || g FROM generate_series(1, 300) g;")
        + _each("INSERT INTO {p}_f SELECT g % 50, 'b' || g FROM generate_series(1, 300) g;")
        + "COMMIT;"
    )
    # Streamed: the copy lane, then the merge lane from the stream's bytes.
    pair.pub_exec(_each("INSERT INTO {p}_k SELECT g, 'w' || g FROM generate_series(301, 6000) g;"))
    pair.pub_exec(_each("UPDATE {p}_k SET v = 'u' || id WHERE id > 300;"))
    # Small transactions: merged UPDATEs through hold_update, FULL identity batches.
    for k in range(3):
        pair.pub_exec(
            "BEGIN;"
            + _each(f"UPDATE {{p}}_k SET v = 'x{k}' || id WHERE id <= 40;")
            + _each(f"UPDATE {{p}}_f SET b = b || '{k}' WHERE a < 30;")
            + _each(f"DELETE FROM {{p}}_f WHERE a = {40 + k};")
            + "COMMIT;"
        )
    wait_equal(pair, ["fast_k", "fast_f", "slow_k", "slow_f"], runner=runner, timeout=120)
    assert runner.stop() == 0
    lane_rows = max([int(m) for m in re.findall(r"lane_rows=(\d+)", runner.log())] or [0])
    assert lane_rows > 5000, runner.log()[-2000:]  # the lanes took fast_* rows

    fast, slow = _dml(pair, "fast"), _dml(pair, "slow")
    for table in ("fast_k", "fast_f"):  # the batched paths were taken
        mine = [s for s in fast if table in s[0]]
        assert sum(s[2] for s in mine) > 2 * sum(s[1] for s in mine), mine
    assert any(s[0].lstrip().upper().startswith("COPY") for s in fast), fast
    # Every slow_* change went alone: one row per statement, and as many as changes.
    assert slow and all(rows == calls for _, calls, rows in slow), slow
    want = {"slow_k": 300 + 5700 + 5700 + 3 * 40, "slow_f": 300 + 3 * 6 * 30 + 3 * 6}
    for table, n in want.items():
        assert sum(s[1] for s in slow if table in s[0]) == n, (table, slow)
