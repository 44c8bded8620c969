"""The spacing of the worker's retries, and how often a fault is logged.

Spacing
=======

A *fault* lasts from the first failed attempt after a healthy session (or
the start) to the next healthy session (:meth:`Worker._healthy`). Attempt n
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

import random
from dataclasses import dataclass

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
