"""The parallel apply schedule on generated histories (pure logic, no I/O).

For random histories of write sets (keys written and read from a small
universe, so conflicts are frequent; some barriers) and random interleavings
of what the leader and its sessions do (add the next transaction, start one
that may start, commit the next one), the schedule:

* never runs two conflicting transactions at once, and never starts one
  before every earlier transaction it conflicts with has committed;
* makes a transaction ready as soon as nothing earlier it conflicts with is
  uncommitted (it does not serialise more than the write sets say), and hands
  ready ones out lowest first;
* commits in source order, and refuses a commit out of order;
* always finishes (no state in which nothing can move) and holds no key
  once everything has committed; its key table never holds more than the
  keys of what is in flight.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from applier.apply.parallel.schedule import Schedule
from applier.apply.parallel.writeset import WriteSet

KEYS = 12


@st.composite
def write_sets(draw: st.DrawFn) -> WriteSet:
    if draw(st.integers(0, 19)) == 0:
        return WriteSet(barrier="TRUNCATE")
    writes = draw(st.frozensets(st.integers(0, KEYS - 1), max_size=3))
    reads = draw(st.frozensets(st.integers(0, KEYS - 1), max_size=3)) - writes
    return WriteSet(writes, reads)


def run_history(sets: list[WriteSet], rng: random.Random, sessions: int, window: int) -> Schedule:
    """Drive a schedule through ``sets`` with random choices; check every step."""
    s = Schedule()
    running: set[int] = set()
    committed = 0
    n = len(sets)
    while committed < n:
        actions = []
        if s.added < n and s.in_flight < window:
            actions.append("add")
        if s.ready() and len(running) < sessions:
            actions.append("start")
        if committed + 1 in running:
            actions.append("commit")
        assert actions, f"stuck: added {s.added}, committed {committed}, running {running}"
        action = rng.choice(actions)
        if action == "add":
            seq = s.add(sets[s.added])
            # Ready at once exactly when nothing earlier that conflicts is uncommitted.
            free = all(not sets[j - 1].conflicts(sets[seq - 1]) for j in range(committed + 1, seq))
            assert (seq in s.ready()) == free, (seq, committed)
        elif action == "start":
            seq = s.next_ready()
            assert seq is not None
            ws = sets[seq - 1]
            for r in running:
                assert not sets[r - 1].conflicts(ws), f"{r} and {seq} conflict and run at once"
            for j in range(1, seq):
                if sets[j - 1].conflicts(ws):
                    assert j <= committed, f"{seq} started before {j} committed"
            running.add(seq)
        else:
            seq = committed + 1
            later = [r for r in running if r != seq]
            for r in later:
                assert not s.may_commit(r)
                with pytest.raises(ValueError):
                    s.commit(r)
            s.commit(seq)
            running.discard(seq)
            committed = seq
        in_flight_keys = sum(
            len(sets[j - 1].writes) + len(sets[j - 1].reads)
            for j in range(committed + 1, s.added + 1)
        )
        assert s.keys_held() <= in_flight_keys
    assert s.in_flight == 0 and s.keys_held() == 0 and not s.ready()
    return s


@settings(max_examples=300, deadline=None)
@given(
    st.lists(write_sets(), max_size=60),
    st.integers(0, 2**32),
    st.integers(1, 8),
    st.integers(1, 20),
)
def test_random_histories(sets: list[WriteSet], seed: int, sessions: int, window: int) -> None:
    run_history(sets, random.Random(seed), sessions, window)


def test_a_long_run_holds_only_what_is_in_flight() -> None:
    """200,000 transactions on 1,000 keys with a window of 64: the key table stays
    bounded by the window (a months-long run is this, longer), and empties."""
    rng = random.Random(36)
    s = Schedule()
    peak = 0
    for _ in range(200_000):
        s.add(WriteSet(frozenset({rng.randrange(1000), rng.randrange(1000)}), frozenset({-1})))
        peak = max(peak, s.keys_held())
        while s.in_flight >= 64:
            _drain_one(s)
    while s.in_flight:
        _drain_one(s)
    assert s.keys_held() == 0 and s.in_flight == 0
    assert peak <= 64 * 3


def _drain_one(s: Schedule) -> None:
    """Start what may start, then commit the next one (a session per transaction)."""
    while s.next_ready() is not None:
        pass
    s.commit(s.committed + 1)


def test_independent_transactions_all_start_at_once() -> None:
    s = Schedule()
    seqs = [s.add(WriteSet(frozenset({k}), frozenset({100}))) for k in range(8)]
    assert s.ready() == seqs
    assert s.counts.by_key == s.counts.by_barrier == 0


def test_a_key_written_waits_for_its_readers_and_writer() -> None:
    s = Schedule()
    a = s.add(WriteSet(frozenset({1})))
    b = s.add(WriteSet(frozenset({2}), frozenset({1})))  # reads what a writes
    c = s.add(WriteSet(frozenset({3}), frozenset({1})))  # reads it too: not after b
    d = s.add(WriteSet(frozenset({1})))  # writes it: after a, b and c
    assert s.ready() == [a] and s.next_ready() == a
    assert s.commit(a) == [b, c]
    assert (s.next_ready(), s.next_ready(), s.next_ready()) == (b, c, None)
    s.commit(b)
    assert s.ready() == []
    assert s.commit(c) == [d]
    assert s.counts.by_key == 3


def test_a_barrier_waits_for_all_and_holds_back_all() -> None:
    s = Schedule()
    a = s.add(WriteSet(frozenset({1})))
    bar = s.add(WriteSet(barrier="TRUNCATE"))
    c = s.add(WriteSet(frozenset({2})))  # shares nothing, still after the barrier
    assert s.ready() == [a] and s.next_ready() == a
    assert s.commit(a) == [bar]
    assert s.next_ready() == bar
    assert s.commit(bar) == [c]
    assert s.counts.by_barrier == 2


def test_abandon_forgets_what_did_not_commit() -> None:
    s = Schedule()
    a = s.add(WriteSet(frozenset({1})))
    s.add(WriteSet(frozenset({1})))
    assert s.next_ready() == a
    s.commit(a)
    s.add(WriteSet(barrier="x"))
    s.abandon()
    assert (s.added, s.committed, s.keys_held(), s.ready()) == (1, 1, 0, [])
    # The stream resends them; they are numbered again from the restart point.
    assert s.add(WriteSet(frozenset({1}))) == 2 and s.ready() == [2]


def run_runs(
    sets: list[WriteSet], rng: random.Random, sessions: int, window: int, limit: int, chain: int
) -> None:
    """As run_history, sessions taking runs (next_run) and committing each whole."""
    s = Schedule()
    runs: list[list[int]] = []
    committed = 0
    n = len(sets)
    while committed < n:
        actions = []
        if s.added < n and s.in_flight < window:
            actions.append("add")
        if s.ready() and len(runs) < sessions:
            actions.append("start")
        if any(r[0] == committed + 1 for r in runs):
            actions.append("commit")
        assert actions, f"stuck: added {s.added}, committed {committed}, runs {runs}"
        action = rng.choice(actions)
        if action == "add":
            s.add(sets[s.added])
        elif action == "start":
            run = s.next_run(limit, chain)
            assert run and run == list(range(run[0], run[0] + len(run)))
            if run[0] != committed + 1:  # only a head run takes waiting ones
                assert len(run) <= limit
            for i, y in enumerate(run):
                for j in range(1, y):
                    if sets[j - 1].conflicts(sets[y - 1]):
                        # Committed before the run, or earlier in the same run.
                        assert j <= committed or j in run[:i], (j, y, run, committed)
            for other in runs:
                for x in other:
                    for y in run:
                        assert not sets[x - 1].conflicts(sets[y - 1]), (x, y)
            runs.append(run)
        else:
            run = next(r for r in runs if r[0] == committed + 1)
            for seq in run:
                s.commit(seq)
            committed = run[-1]
            runs.remove(run)
    assert s.in_flight == 0 and s.keys_held() == 0 and not s.ready()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(write_sets(), max_size=60),
    st.integers(0, 2**32),
    st.integers(1, 8),
    st.integers(1, 20),
    st.integers(1, 4),
    st.integers(1, 30),
)
def test_random_histories_of_runs(
    sets: list[WriteSet], seed: int, sessions: int, window: int, limit: int, chain: int
) -> None:
    """Runs of consecutive transactions: nothing in a run conflicts with a run beside
    it, and a transaction joins a run only after what it conflicts with (committed
    before, or earlier in the run); a chain on one key goes as one run."""
    run_runs(sets, random.Random(seed), sessions, window, limit, chain)


def test_a_chain_on_one_key_is_one_run() -> None:
    s = Schedule()
    hot = WriteSet(frozenset({1}))
    seqs = [s.add(hot) for _ in range(10)]
    assert s.ready() == [1]
    assert s.next_run(2, chain=6) == seqs[:6]  # the head run takes the chain
    assert s.next_run(2, chain=6) == []  # the rest waits for it
    for seq in seqs[:6]:
        s.commit(seq)
    assert s.next_run(2, chain=6) == seqs[6:10]
