"""The spacing of the worker's retries, and how often a fault is logged.

Spacing
=======

A *fault* lasts from the first failed attempt after a healthy session (or
the start) to the next healthy session (:meth:`Retry.healthy`). Attempt n
of a fault waits a random time in [cap/2, cap], with
``cap = min(0.5 * 2**(n-1), limit)``; the limit depends on the fault's age:

* 1 s while the fault is younger than a minute. Most faults are that short
  (a server restart, a failover, a terminated backend), and what matters is
  how soon the worker resumes once the server is back: with the former
  exponential backoff up to 30 s, a target restart of 4.2 s was followed by
  11 s of sleep while the target already accepted connections (issue 31,
  item 12; ``tests/apply/test_apply_target_restart.py`` measures it). An
  attempt against a server that is down costs a refused connection; one
  against a server still starting, a FATAL reply: nothing a second apart
  burdens.
* then a tenth of the fault's age, up to 30 s: a fault that persists (a
  server down for maintenance, a network cut) is retried less and less
  often, and the worker still resumes within a tenth of the outage.

The jitter's floor (half the cap) keeps the attempts of one worker from
bunching; the first attempt waits at most 0.5 s (a fault after a healthy
session reconnects at once).

Log
===

A fault is logged when it begins (a warning with the error), then at most
once a minute while it lasts, and once when the worker connected again;
every attempt is logged at debug level only. ``applier status`` and
systemd's ``STATUS=`` show each attempt's error.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from tenacity import RetryCallState, Retrying, retry_if_exception

from applier.apply.target.session import is_transient_sqlstate
from applier.errors import ApplierError, TransientError

log = logging.getLogger("applier.apply")

#: A session that streamed this long without a fault counts as healthy (resets
#: the backoff) even if the source was idle and no position moved.
HEALTHY_AFTER = 60.0

#: The first attempt's longest wait.
FIRST_WAIT = 0.5
#: A fault younger than this is retried at most YOUNG_CAP s apart.
YOUNG = 60.0
YOUNG_CAP = 1.0
#: An older one waits up to this fraction of its age, and at most MAX_BACKOFF s.
AGE_FRACTION = 0.1
MAX_BACKOFF = 30.0
#: A lasting fault is logged again this often.
REMIND_EVERY = 60.0


def backoff_cap(attempt: int, fault_age: float) -> float:
    """The longest wait before retry ``attempt`` (1 = the first) of a fault ``fault_age`` s old."""
    limit = YOUNG_CAP if fault_age < YOUNG else min(MAX_BACKOFF, AGE_FRACTION * fault_age)
    return min(FIRST_WAIT * 2.0 ** min(attempt - 1, 32), limit)


def backoff(attempt: int, fault_age: float, rnd: random.Random | None = None) -> float:
    """Seconds to wait before retry ``attempt``: in [cap/2, cap] (see "Spacing")."""
    cap = backoff_cap(attempt, fault_age)
    return (rnd or random).uniform(cap / 2, cap)


@dataclass
class Fault:
    """One fault: from its first failed attempt to the next healthy session."""

    since: float
    attempts: int = 0
    logged_at: float = float("-inf")
    reconnected: bool = False

    def age(self, now: float) -> float:
        return now - self.since

    def worth_logging(self, now: float) -> bool:
        """The first attempt, then one a minute (see "Log")."""
        if now - self.logged_at < REMIND_EVERY:
            return False
        self.logged_at = now
        return True


def retryable(exc: BaseException) -> bool:
    """A transient fault (a lost connection, a server restarting, 55006 ...): retried."""
    if isinstance(exc, TransientError):
        return True
    return isinstance(exc, ApplierError) and is_transient_sqlstate(exc.context.get("sqlstate"))


class Retry:
    """The worker's retries of transient faults: tenacity's loop over sessions, each
    attempt spaced (:func:`backoff`) and logged (:meth:`Fault.worth_logging`) as above.

    ``sleep`` waits between attempts (the worker's: alive and stoppable);
    ``on_retry(exc, attempt, wait)`` shows the fault before each wait.
    """

    def __init__(
        self,
        sleep: Callable[[float], None],
        on_retry: Callable[[BaseException | None, int, float], None],
    ) -> None:
        self.sleep = sleep
        self.on_retry = on_retry
        #: The fault being retried, None while healthy.
        self.fault: Fault | None = None
        self._state: RetryCallState | None = None

    def attempts(self) -> Retrying:
        """The retry loop: one spans the process (a healthy session resets it)."""
        return Retrying(
            retry=retry_if_exception(retryable),
            wait=self._wait,
            sleep=self.sleep,
            before_sleep=self._before_sleep,
            reraise=True,
        )

    def started(self, state: RetryCallState) -> None:
        """An attempt of the loop began (its state is what :meth:`healthy` resets)."""
        self._state = state

    def _wait(self, rs: RetryCallState) -> float:
        """tenacity's wait: spaced by the fault's age."""
        now = time.monotonic()
        if self.fault is None:
            self.fault = Fault(now)
        return backoff(rs.attempt_number, self.fault.age(now))

    def _before_sleep(self, rs: RetryCallState) -> None:
        exc = rs.outcome.exception() if rs.outcome else None
        wait = rs.next_action.sleep if rs.next_action else 0
        fault = self.fault
        assert fault is not None  # _wait ran first
        fault.attempts += 1
        now = time.monotonic()
        first = fault.attempts == 1
        (log.warning if fault.worth_logging(now) else log.debug)(
            "retrying after a transient error: %s" if first else "still retrying: %s",
            exc,
            extra={
                "ctx": {
                    "attempt": rs.attempt_number,
                    "fault_s": round(fault.age(now), 1),
                    "wait_s": round(wait, 1),
                }
            },
        )
        self.on_retry(exc, rs.attempt_number, wait)

    def healthy(self) -> None:
        """A session confirmed progress (or streamed for HEALTHY_AFTER s):
        the fault is over, and the backoff starts again from the first attempt's.

        tenacity counts attempts in the RetryCallState of the running loop;
        setting it back to 1 makes the next fault wait what a first fault
        waits (up to 0.5 s) instead of growing with every fault of the
        process's life. Applied *and* confirmed, not just connected: a fault
        that recurs before anything is applied keeps backing off.
        """
        self.fault = None
        rs = self._state
        if rs is not None and rs.attempt_number > 1:
            log.debug(
                "session healthy; retry backoff reset",
                extra={"ctx": {"faults": rs.attempt_number - 1}},
            )
            rs.attempt_number = 1

    def reconnected(self) -> None:
        """Streaming again during a fault: said once per fault."""
        fault = self.fault
        if fault is None or fault.reconnected:
            return
        fault.reconnected = True
        log.info(
            "reconnected after a transient error",
            extra={
                "ctx": {
                    "fault_s": round(fault.age(time.monotonic()), 1),
                    "attempts": fault.attempts,
                }
            },
        )
