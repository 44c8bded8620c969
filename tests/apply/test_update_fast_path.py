"""The UPDATE fast path (``mergelane.hold_update``) holds exactly what ``on_update``'s
ordinary path holds.

``on_update`` first offers a change to ``hold_update``, which holds it in one step
when its table already holds merged UPDATEs; anything else goes the ordinary way
(``_target``, the merger's ``add``). Generated transactions of UPDATEs (and a few
INSERTs and DELETEs) on three tables, one with a two-column key, with unchanged
TOAST values, old keys, wrong widths, transactions skipped as applied, a table
being synced and an object skip rule: the statements sent, their parameters, the
context of every row (LSN, xid, change number, message), the tallies and the
errors must be the same with the fast path and without it. The end-to-end apply
tests on real servers run the fast path (pgbench-like groups in test_apply_group,
rows not found in test_apply_merge).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from applier.apply.batching import merge, mergelane
from applier.apply.batching.paths import refresh as refresh_paths
from applier.apply.core.states import MergedCtx
from applier.apply.handlers import changes, groupcommit
from applier.apply.handlers.dispatch import Applier
from applier.apply.rules.skiprules import Rule
from applier.apply.sql.mapping import RelMap, TargetColumn, TargetTable
from applier.config import config_from_dict
from applier.errors import ProtocolError
from applier.lsn import Lsn
from applier.protocol import Begin, Column, Commit, Delete, Insert, Relation, TupleData, Update

#: (oid, key columns, width) of the tables.
TABLES = [(1, (0,), 3), (2, (0, 1), 4), (3, (0,), 2)]


class RecordingSession:
    """The target session's interface, recording what would be sent."""

    def __init__(self) -> None:
        self.in_txn = False
        self.multi_row = True
        self.txn_context: dict[str, Any] = {}
        self.on_missing: Any = None
        self.sent: list[Any] = []

    def begin(self) -> None:
        self.in_txn = True

    def execute(self, stmt: Any, params: Any, fmts: Any, ctx: Any, **kw: Any) -> None:
        ctxs = ctx.ctxs if isinstance(ctx, MergedCtx) else [ctx]
        rows = [
            c if isinstance(c, str) else (c.lsn, c.xid, c.no, c.change, c.describe()) for c in ctxs
        ]
        self.sent.append((stmt.query, list(params), fmts, rows))

    def insert(self, stmt: Any, params: Any, fmts: Any, ctx: Any) -> None:
        self.execute(stmt, params, fmts, ctx)

    def commit(self, end_lsn: Lsn, ts: int, done: Any, wait: bool = False) -> None:
        self.sent.append(("COMMIT", int(end_lsn)))
        self.in_txn = False
        done(Lsn(0))

    def rollback(self) -> None:
        self.sent.append(("ROLLBACK",))
        self.in_txn = False

    def settle(self) -> None:
        pass

    def flush_checks(self) -> None:
        """No results to read: nothing here reports a conflict."""

    def forget_statements(self, names: Any) -> None:
        pass


def _applier() -> tuple[Applier, RecordingSession]:
    cfg = config_from_dict(
        {
            "source": {"dsn": "host=x", "publications": ["p"]},
            "target": {"dsn": "host=y", "origin": "o"},
        }
    )
    session = RecordingSession()
    catalog: Any = SimpleNamespace(conn=None)
    a = Applier(cfg, session, catalog, None, Lsn(500), 1000)  # type: ignore[arg-type]
    for oid, key, width in TABLES:
        cols = tuple(Column(1 if i in key else 0, f"c{i}", 23, -1) for i in range(width))
        rel = Relation(None, oid, "s", f"t{oid}", "d", cols)
        tcols = {f"c{i}": TargetColumn(f"c{i}", 23, "integer", True, False) for i in range(width)}
        target = TargetTable(oid + 100, "s", f"t{oid}", "r", tcols)
        a.relations[oid] = rel
        a.relmaps[oid] = RelMap(rel, oid, True, target, tuple(tcols.values()), key, merge=True)
    return a, session


def _tuple(width: int, key: tuple[int, ...], k: int, v: int, toast: int, null: int) -> TupleData:
    kinds, values = bytearray(), []
    for i in range(width):
        if i == toast:
            kinds.append(ord("u"))
            values.append(None)
        elif i == null and i not in key:
            kinds.append(ord("n"))
            values.append(None)
        else:
            kinds.append(ord("t"))
            values.append(str(k if i in key else v * 10 + i).encode())
    return TupleData(bytes(kinds), tuple(values))


change = st.tuples(
    st.sampled_from(["update"] * 8 + ["insert", "delete", "old_key", "wide"]),
    st.sampled_from(range(len(TABLES))),
    st.integers(0, 5),  # key
    st.integers(0, 99),  # value
    st.integers(-1, 7),  # an unchanged TOAST column (if in range)
    st.integers(-1, 7),  # a NULL column (if in range)
)
txn = st.tuples(st.booleans(), st.lists(change, max_size=12))  # (applied before, changes)
setting = st.sampled_from(["none", "sync", "object_rule", "txn_rule", "dump_all", "one_by_one"])
#: Held rows' limits: as shipped, or reached after a few rows, or a few bytes.
limits = st.sampled_from(["default", "rows", "bytes"])


def _messages(txns: list[tuple[bool, list[Any]]]) -> list[Any]:
    out: list[Any] = []
    lsn = 1000
    for n, (applied, chs) in enumerate(txns):
        first = lsn
        xid = 700 + n
        out.append((Lsn(first), Begin(Lsn(100 if applied else first + 90), 0, xid)))
        for i, (op, t, k, v, toast, null) in enumerate(chs):
            oid, key, width = TABLES[t]
            tup = _tuple(width + (op == "wide"), key, k, v, toast, null)
            at = Lsn(first + 1 + i)
            if op == "insert":
                msg: Any = Insert(xid, oid, _tuple(width, key, k, v, -1, null))
            elif op == "delete":
                msg = Delete(xid, oid, _tuple(width, key, k, 0, -1, -1), "K")
            elif op == "old_key":
                msg = Update(xid, oid, _tuple(width, key, k + 1, 0, -1, -1), "K", tup)
            else:
                msg = Update(xid, oid, None, None, tup)
            out.append((at, msg))
        out.append((Lsn(first + 90), Commit(0, Lsn(first + 90), Lsn(first + 95), 0)))
        lsn += 100
    return out


#: The limits of held rows, and where they are read; and the groups' ages, pinned
#: so both runs group alike (2 ms of wall clock on a busy machine is not).
LIMITS = [
    *((m, name) for m in (merge, mergelane, changes) for name in ("MAX_HELD", "MAX_HELD_BYTES")),
    (groupcommit, "GROUP_MAX_AGE"),
    (groupcommit, "GROUP_MAX_AGE_BEHIND"),
]


def _set_up(a: Applier, setting: str) -> None:
    """Between two batches, as the worker does: sync-tables starts on table 2, or an
    object rule that skips table 1's UPDATEs is loaded."""
    if setting == "sync":
        a.syncs = SimpleNamespace(
            cut={2: Lsn(10**9)}, generation=1, qualname=lambda oid: f"s.t{oid}"
        )  # type: ignore[assignment]
    elif setting == "object_rule":
        rule = Rule(1, "object", "s.t1", frozenset({"update"}), None, None, None, "none")
        a.rules._set((rule,))
    elif setting == "txn_rule":  # skips the third transaction, which may join a group
        a.rules._set((Rule(2, "txn", None, None, 702, None, None, "none"),))
    elif setting == "dump_all":  # table 3's UPDATEs skipped, with every change beside them
        a.rules._set((Rule(3, "object", "s.t3", frozenset({"update"}), None, None, None, "all"),))
    elif setting == "one_by_one":  # as after a failed group: not merged up to there
        a.no_group_until = Lsn(1500)
    refresh_paths(a)  # as the worker does after reloading rules and cuts


def _run(msgs: list[Any], setting: str, small: str, fast: bool) -> Any:
    saved = [(m, name, getattr(m, name)) for m, name in LIMITS if hasattr(m, name)]
    hold = changes.hold_update
    if not fast:
        changes.hold_update = lambda applier, lsn, m: 0
    for m, name, _ in saved:  # few rows or bytes fill a table's held rows
        if name.startswith("GROUP_MAX_AGE"):
            setattr(m, name, float("inf"))
        elif small == "rows" and name == "MAX_HELD":
            setattr(m, name, 4)
        elif small == "bytes" and name == "MAX_HELD_BYTES":
            setattr(m, name, 20)
    try:
        a, session = _applier()
        error = None
        try:
            for i in range(0, len(msgs), 7):  # batches, as the worker cuts them
                for lsn, msg in msgs[i : i + 7]:
                    a.dispatch(lsn, msg)
                a.commit_group()
                if i == 7:
                    _set_up(a, setting)
        except ProtocolError as e:
            error = str(e)
    finally:
        changes.hold_update = hold
        for m, name, value in saved:
            setattr(m, name, value)
    return session.sent, dict(a.tally.changes), a.applied_txns, a.skipped_changes, error


@settings(max_examples=300, deadline=None)
@given(st.lists(txn, max_size=6), setting, limits)
@example([(False, [("update", 0, 1, 1, -1, -1), ("update", 0, 1, 2, -1, -1)])], "none", "default")
@example([(False, [("update", 1, 1, 1, -1, -1), ("update", 1, 2, 2, 2, -1)])], "none", "default")
@example([(False, [("update", 0, k, 1, -1, -1) for k in range(6)])], "none", "rows")
@example([(False, [("update", 0, k, 11, -1, -1) for k in range(6)])], "none", "bytes")
@example(
    [
        (False, [("insert", 2, k, 1, -1, -1) for k in range(5)]),
        (False, [("update", 0, k % 3, k, -1, -1) for k in range(12)]),
    ],
    "object_rule",
    "default",
)
@example(  # sync-tables starts on table 2 in the middle of a transaction updating it
    [
        (False, [("update", 1, k, 1, -1, -1) for k in range(4)]),
        (False, [("update", 1, k % 6, 2, -1, -1) for k in range(12)]),
    ],
    "sync",
    "default",
)
@example(  # the skipped transaction comes while the group holds the table's rows
    [
        (False, [("update", 0, k % 6, 1, -1, -1) for k in range(6)]),
        (False, [("update", 0, k % 6, 2, -1, -1) for k in range(6)]),
        (False, [("update", 0, 1, 3, -1, -1)]),
    ],
    "txn_rule",
    "default",
)
@example(
    [(False, [("update", 0, k, 1, -1, -1) for k in range(2)])] * 2
    + [(False, [("update", 0, 3, 1, -1, -1)])] * 2,
    "txn_rule",
    "default",
)
@example(  # a group open across the set-up, the next transaction not merged
    [
        (False, [("update", 0, 1, 1, -1, -1)] * 3),
        (False, [("update", 0, k % 4, k, -1, -1) for k in range(10)]),
        (False, [("update", 0, 1, 5, -1, -1), ("update", 0, 2, 5, -1, -1)]),
    ],
    "one_by_one",
    "default",
)
@example(  # after the set-up, every change of a transaction is seen and kept
    [
        (False, [("insert", 2, k, 1, -1, -1) for k in range(5)]),
        (False, [("insert", 2, k + 5, 1, -1, -1) for k in range(5)]),
        (False, [("update", 0, 1, 1, -1, -1), ("update", 0, 2, 1, -1, -1)]),
        (False, [("update", 0, 1, 1, -1, -1), ("update", 2, 2, 1, -1, -1)]),
    ],
    "dump_all",
    "default",
)
def test_fast_path_sends_what_the_ordinary_path_sends(
    txns: list[Any], setting: str, small: str
) -> None:
    msgs = _messages(txns)
    assert _run(msgs, setting, small, True) == _run(msgs, setting, small, False)


def test_fast_path_takes_the_second_update_of_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is taken at all (else the property above proves nothing)."""
    taken: list[int] = []
    hold = changes.hold_update

    def counting(applier: Any, lsn: Lsn, m: Any) -> int:
        held = hold(applier, lsn, m)
        taken.append(held)
        return held

    monkeypatch.setattr(changes, "hold_update", counting)
    msgs = _messages([(False, [("update", 0, k, 1, -1, -1) for k in range(4)])])
    sent, tally, applied, _, error = _run(msgs, "none", "default", True)
    assert taken == [0, 1, 1, 1] and error is None and applied == 1
    assert tally == {}  # committed: the open transaction's tally was taken
    rows = sent[0][3]
    # Change numbers 1..4 (as ChangeCtx counts them), each with its own message.
    want = [(1, b"0"), (2, b"1"), (3, b"2"), (4, b"3")]
    assert [(r[2], r[3].new.values[0]) for r in rows] == want
