"""The lane choice of parallel apply (applier.apply.parallel.lanes) on replayed histories.

Pure logic: the clocks a leader would read (wall, process CPU, time waiting for the
stream, transactions applied) are generated, window by window, from a model of
each lane's speed and busy share, and the choice is asserted: where it goes, that
it checks each switch and leaves a slower lane at once, that a workload between
the thresholds cannot make it flap, and that a starved stream moves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from applier.apply.parallel.lanes import (
    HOLD_FIRST,
    HOLD_MAX,
    PROBE,
    SPAN,
    TRY_INLINE,
    TRY_POOL,
    WINDOW,
    LaneChoice,
)


@dataclass
class Lane:
    """How a lane behaves under a workload: transactions a second, busy share."""

    rate: float
    busy: float


class Clock:
    """Feeds a LaneChoice window by window, as the leader's read loop would."""

    def __init__(self, choice: LaneChoice) -> None:
        self.choice = choice
        self.now = self.cpu = self.waited = 0.0
        self.txns = 0.0
        self.lanes_seen: list[bool] = []

    def run(self, pool: Lane, inline: Lane, seconds: float, starved: float = 0.0) -> None:
        """``seconds`` of wall time in steps of a fifth of a window."""
        step = WINDOW / 5
        for _ in range(round(seconds / step)):
            lane = pool if self.choice.pool else inline
            self.now += step
            self.cpu += step * lane.busy
            self.waited += step * starved
            self.txns += step * lane.rate
            self.choice.tick(self.now, self.cpu, self.waited, int(self.txns))
            self.lanes_seen.append(self.choice.pool)
            if self.choice.wanted and not self.choice.pool_ready:
                self.choice.ready(self.now)  # the members open at once here


def choice(adaptive: bool = True) -> LaneChoice:
    return LaneChoice(adaptive, 0.0, 0.0)


# A hot row, CPU-bound: the pool is slower and keeps the process busy.
HOT_POOL, HOT_INLINE = Lane(rate=5_500, busy=0.8), Lane(rate=8_000, busy=0.65)
# A target that waits on its disk: the pool is 3x faster, the process mostly idle.
IO_POOL, IO_INLINE = Lane(rate=900, busy=0.15), Lane(rate=300, busy=0.05)


def test_not_adaptive_is_always_the_pool() -> None:
    c = choice(adaptive=False)
    clock = Clock(c)
    clock.run(HOT_POOL, HOT_INLINE, 5)
    assert all(clock.lanes_seen) and c.switches == 0


def test_starts_inline_and_stays_there_while_cpu_is_the_limit() -> None:
    c = choice()
    clock = Clock(c)
    clock.run(HOT_POOL, HOT_INLINE, PROBE * HOLD_FIRST - WINDOW)
    assert not any(clock.lanes_seen)
    assert not c.wanted  # the members are not even opened before a probe
    assert not c.leaning  # the leader's session may queue as much as one session does
    # Probes later find the pool slower each time, ever more rarely.
    clock.run(HOT_POOL, HOT_INLINE, 120)
    assert not c.pool or c.checking  # a probe being checked
    assert sum(clock.lanes_seen) < 0.1 * len(clock.lanes_seen)
    assert c.switches <= 2 * 5  # probes at 5, 10, 20, 40, 80 s of holds


def test_a_probe_finds_what_busy_cannot_see() -> None:
    # The pool waits on its commits' round trips (idle) while one session groups the
    # same transactions twice as fast: busy never says "inline", a probe does.
    c = choice()
    clock = Clock(c)
    clock.run(Lane(rate=5000, busy=0.3), Lane(rate=4000, busy=0.3), 3)
    assert c.pool  # inline looked idle: it tried the pool, which was faster then
    clock.run(Lane(rate=1000, busy=0.3), Lane(rate=4000, busy=0.3), 20)
    assert not c.pool or c.checking
    assert sum(clock.lanes_seen[-50:]) < 10


def test_moves_to_the_pool_when_the_target_is_the_limit() -> None:
    c = choice()
    clock = Clock(c)
    clock.run(IO_POOL, IO_INLINE, 10)
    assert c.pool  # a probe of inline after 5 s finds it slower and comes back
    assert sum(clock.lanes_seen) > 0.85 * len(clock.lanes_seen)  # within a few windows


def test_waits_for_the_members_before_it_moves() -> None:
    c = choice()
    w = WINDOW * 1.01
    for i in range(1, 20):
        c.tick(i * w, i * w * IO_INLINE.busy, 0.0, int(i * w * IO_INLINE.rate))
    assert c.wanted and not c.pool and c.leaning
    c.ready(19 * w)  # the members opened: it moves at once, not a window later
    assert c.pool and c.switches == 1


def test_follows_the_workload_both_ways() -> None:
    c = choice()
    clock = Clock(c)
    clock.run(IO_POOL, IO_INLINE, 5)
    assert c.pool
    clock.run(HOT_POOL, HOT_INLINE, 5)
    assert not c.pool
    clock.run(IO_POOL, IO_INLINE, 5)
    assert c.pool


def test_a_slower_lane_is_left_at_once_and_not_tried_again_soon() -> None:
    # Busy says "try the pool" but the pool is slower (a bad guess): one window
    # in it, then back, and no new try until the hold has passed.
    c = choice()
    clock = Clock(c)
    clock.run(Lane(rate=500, busy=0.2), Lane(rate=1000, busy=0.2), HOLD_FIRST * 0.9)
    assert not c.pool
    assert c.switches == 2
    # Windows in the pool: the switch's own and the SPAN it is checked over.
    assert sum(clock.lanes_seen) / 5 <= 1 + SPAN


def test_between_the_thresholds_it_cannot_flap() -> None:
    # Inline looks idle (try the pool), the pool looks busy (try inline): each try
    # is checked, the holds double, so switches grow with log(time), not time.
    c = choice()
    clock = Clock(c)
    clock.run(Lane(rate=1000, busy=TRY_INLINE + 0.1), Lane(rate=1000, busy=TRY_POOL - 0.1), 300)
    assert c.switches < 30
    # Equal speed: neither switch is undone, so it stays where it went.
    c2 = choice()
    clock2 = Clock(c2)
    clock2.run(Lane(rate=1000, busy=TRY_INLINE + 0.1), Lane(rate=999, busy=0.3), 60)
    assert c2.pool == clock2.lanes_seen[-1]


def test_holds_are_bounded() -> None:
    c = choice()
    clock = Clock(c)
    clock.run(Lane(rate=100, busy=0.1), Lane(rate=1000, busy=0.1), 3 * HOLD_MAX)
    assert max(c.hold(True), c.hold(False)) <= HOLD_MAX
    assert c.switches >= 4  # it kept trying, at most every HOLD_MAX s


def test_a_starved_stream_moves_nothing() -> None:
    for start_in_pool in (False, True):
        c = choice()
        c.pool = start_in_pool
        c.pool_ready = True
        clock = Clock(c)
        clock.run(Lane(rate=50, busy=0.95), Lane(rate=50, busy=0.01), 10, starved=0.5)
        assert c.pool is start_in_pool and c.switches == 0
        if not start_in_pool:
            assert not c.leaning  # a short queue would only add waits for results


@settings(max_examples=300, deadline=None)
@given(st.floats(10, 10_000), st.floats(0, 1), st.floats(10, 10_000), st.floats(0, 1))
def test_any_workload_ends_in_the_faster_lane(pr: float, pb: float, ir: float, ib: float) -> None:
    """Whatever one workload does in each lane, after 20 s it sits in the clearly
    faster lane, or is in the middle of checking a move, and spent most of the time
    in the faster one."""
    c = choice()
    clock = Clock(c)
    clock.run(Lane(pr, pb), Lane(ir, ib), 20)
    if abs(ib - TRY_POOL) < 0.01:
        return  # at the threshold itself the clocks' rounding decides
    if ib > TRY_POOL and pr < ir * 0.8:
        # Only probes leave inline, and the slower pool is left again at once.
        assert sum(clock.lanes_seen) < 0.35 * len(clock.lanes_seen)
        return
    checking = c.checking
    if pr > ir * 1.25:
        assert c.pool or checking
    elif ir > pr * 1.25:
        assert not c.pool or checking
    # A slower lane is never where it spends most of the time.
    if abs(pr - ir) > 0.25 * max(pr, ir):
        in_pool = sum(clock.lanes_seen) / len(clock.lanes_seen)
        assert (in_pool > 0.5) == (pr > ir)


@pytest.mark.parametrize("busy", [TRY_POOL - 0.01, TRY_INLINE])
def test_thresholds_are_where_the_docstring_says(busy: float) -> None:
    c = choice()
    c.pool_ready = True
    c.pool = busy >= TRY_INLINE
    clock = Clock(c)
    clock.run(Lane(rate=100, busy=busy), Lane(rate=100, busy=busy), 3 * WINDOW)
    assert c.switches == 1
