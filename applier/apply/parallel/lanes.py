"""Which lane ordinary transactions take: the pool, or the leader's own session inline.

The members are threads of one Python process: they share one interpreter lock.
A pool pays off while the members *wait on the target* (a table that does not fit
in memory, a trigger, a slow disk: the GIL is free while a session waits), and
costs while applier's own CPU is the limit: the leader holds and keys every
change, then a member replays it, two passes where one session makes one
(``bench/README-parallel.md``: hot-row TPC-B with 4 sessions 1.38x slower than
one). So with ``[apply] adaptive`` (the default) the leader measures, in windows
of :data:`WINDOW` s of wall time, how busy the process is:

* **inline -> pool** when the process was busy less than :data:`TRY_POOL` of a
  window in which it did not wait for the stream: the target is the limit, more
  sessions may help.
* **pool -> inline** when it was busy at least :data:`TRY_INLINE` of such a
  window: applier's CPU is the limit, one pass per change is what helps.
* A window in which the leader waited for the stream longer than
  :data:`STARVED` of it says nothing (the source is the limit; either lane keeps
  up): the lane stays.

A busy fraction is a guess at the other lane's speed, so each switch is *checked*:
the first full window after it is compared, in transactions a second, with the
last window before it. A lane slower by more than :data:`WORSE` than the one it
replaced is left again at once, and the busy rule may not try that move for
:data:`HOLD_FIRST` s, doubled at each failed try up to :data:`HOLD_MAX`. A lane
as fast (within :data:`WORSE`) stays, and the move back is held the same way,
so a workload between the two thresholds cannot flap: its switches grow with
the logarithm of time. A clearly faster lane resets its move's hold.

What the busy share cannot see, a *probe* finds: a pool of small transactions
that waits on its commits' round trips looks idle, yet one session grouping
them is faster. So a lane kept :data:`PROBE` times its move's hold (5 s at first)
tries the other, checked as above: a failed probe doubles the hold (up to
:data:`HOLD_MAX`), so probing costs a shrinking share of a long run. Where the transactions depend
on one another (a hot row) the pool serialises them anyway; that shows as a busy
process, and the leader's session takes them one pass each, as ``workers = 1``.

Only the lane of ordinary transactions is chosen here; barriers, streamed and
two-phase transactions go to the leader's session in either lane
(:mod:`.leader`). The members open in the background while the first
transactions go inline (:meth:`~.pool.Pool.opened`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

#: Wall seconds per measuring window.
WINDOW = 0.2
#: Windows a lane's rate is measured over (before a switch and to check it).
SPAN = 4
#: Busy below this (share of one CPU) in the inline lane: try the pool.
TRY_POOL = 0.4
#: Busy at least this in the pool lane: try inline.
TRY_INLINE = 0.6
#: Waiting for the stream more than this share of a window: the source is the limit.
STARVED = 0.2
#: A lane slower than the one it replaced by more than this is left again.
WORSE = 0.1
#: A lane held this many times its move's hold (HOLD_FIRST at first: 5 s) is
#: left for a probe of the other, checked like any move.
PROBE = 2.5
#: Seconds a failed move is not tried again, doubling up to HOLD_MAX.
HOLD_FIRST = 2.0
HOLD_MAX = 120.0


@dataclass(slots=True)
class Window:
    """What one window measured."""

    wall: float
    cpu: float
    waited: float
    txns: int

    @property
    def starved(self) -> bool:
        return self.waited > STARVED * self.wall

    @property
    def busy(self) -> float:
        return self.cpu / self.wall

    @property
    def rate(self) -> float:
        return self.txns / self.wall

    def figures(self) -> dict[str, float]:
        """For the log: busy share and transactions a second."""
        return {"busy": round(self.busy, 2), "per_second": round(self.rate)}


class LaneChoice:
    """The one decision: ordinary transactions to the pool (:attr:`pool`) or inline.

    ``adaptive`` False: always the pool. Fed by :meth:`tick` with clocks the caller
    reads (wall, process CPU, time spent waiting for the stream, transactions
    begun, all cumulative), so that histories can be replayed in tests.
    """

    def __init__(self, adaptive: bool, now: float, cpu: float) -> None:
        self.adaptive = adaptive
        #: Start inline while the members open (pool when not adaptive).
        self.pool = not adaptive
        self._start = (now, cpu, 0.0, 0)
        #: When the window ends (the caller need not read its clocks before).
        self.next_at = now + WINDOW if adaptive else float("inf")
        #: The last windows (at most SPAN) of the current lane with a backlog.
        self._recent: deque[Window] = deque(maxlen=SPAN)
        #: Those of the lane before a switch, merged, while the switch is checked.
        self._before: Window | None = None
        self._skip = False  # the window a switch happened in mixes both lanes
        #: Per move (True: to the pool), not before this time; the next hold.
        self._hold_until = {True: 0.0, False: 0.0}
        self._hold = {True: HOLD_FIRST, False: HOLD_FIRST}
        self.switches = 0
        #: Since when the current lane is taken (a probe comes PROBE holds later).
        self._since = self._now = now
        #: Why the last switch happened, and the figures it was made on (the log's).
        self.last_reason: dict[str, object] = {}
        #: The members are open; until then :attr:`wanted` says the pool would be tried.
        self.pool_ready = not adaptive
        self.wanted = False
        #: Inline, the last window said the target is the limit (or none was measured
        #: yet): the leader keeps its session's queue short, so that a move to the pool
        #: waits for little, and a slow target shows in the first window.
        self.leaning = adaptive

    @property
    def checking(self) -> bool:
        """A move was made and its rate is not compared yet."""
        return self._before is not None or self._skip

    def hold(self, to_pool: bool) -> float:
        """Seconds the next failed move to the pool (or inline) will be held."""
        return self._hold[to_pool]

    def tick(self, now: float, cpu: float, waited: float, txns: int) -> None:
        """Cumulative clocks now; decides at the end of each window."""
        t0, c0, w0, n0 = self._start
        wall = now - t0
        if wall < WINDOW or not self.adaptive:
            return
        self._now = now
        self._start = (now, cpu, waited, txns)
        self.next_at = now + WINDOW
        w = Window(wall, cpu - c0, waited - w0, txns - n0)
        if not self.pool:  # a source that is the limit gains nothing from a short queue
            self.leaning = not w.starved and w.busy < TRY_POOL
        if self._skip:
            self._skip = False
            return
        if w.starved:
            self._recent.clear()  # a rate is compared over windows with a backlog
            return
        recent = self._recent
        recent.append(w)
        if self._before is not None:
            if len(recent) == SPAN:
                self._check(now, merged(recent))
            return
        move = not self.pool
        if now < self._hold_until[move]:
            return
        # What busy cannot see (a pool waiting on its commits' round trips, an inline
        # session a little busy) a probe finds: the other lane, now and then.
        probe = now - self._since >= PROBE * self._hold[move]
        if self.pool and (w.busy >= TRY_INLINE or probe):
            why = "applier's CPU is the limit" if w.busy >= TRY_INLINE else "a probe"
            self._switch(merged(recent), why)
        elif not self.pool and (w.busy < TRY_POOL or probe):
            if self.pool_ready:
                why = "the target is the limit" if w.busy < TRY_POOL else "a probe"
                self._switch(merged(recent), why)
            else:
                self.wanted = True  # the leader opens the members; inline meanwhile

    def ready(self, now: float) -> None:
        """The members are open: if the last window asked for the pool, move now."""
        self.pool_ready = True
        self._now = now
        if not self.pool and self.leaning and now >= self._hold_until[True]:
            self._switch(merged(self._recent) if self._recent else None, "the target is the limit")

    def _switch(self, last: Window | None, why: str) -> None:
        self.last_reason = {"why": why, **({} if last is None else last.figures())}
        self._since = self._now
        self.pool = not self.pool
        self._before = last
        self._recent.clear()
        self._skip = True
        self.switches += 1

    def _check(self, now: float, after: Window) -> None:
        before = self._before
        assert before is not None
        self._before = None
        tried = self.pool
        if after.rate > before.rate * (1 + WORSE):
            self._hold[tried] = HOLD_FIRST  # clearly better: a later try starts afresh
        elif after.rate >= before.rate * (1 - WORSE):
            self._held(now, not tried)  # as fast: going back needs a reason that lasts
        else:
            # Slower: back at once (not checked again), and not tried again soon.
            self._switch(None, f"slower than before the last switch ({before.rate:.0f}/s)")
            self.last_reason.update(after.figures())
            self._held(now, tried)

    def _held(self, now: float, move: bool) -> None:
        """The busy rule may not move to the pool (``move``) or inline for a while,
        twice as long as last time."""
        self._hold_until[move] = now + self._hold[move]
        self._hold[move] = min(HOLD_MAX, self._hold[move] * 2)


def merged(windows: Iterable[Window]) -> Window:
    """Consecutive windows as one."""
    ws = list(windows)
    return Window(
        sum(w.wall for w in ws), sum(w.cpu for w in ws), sum(w.waited for w in ws),
        sum(w.txns for w in ws),
    )  # fmt: skip
