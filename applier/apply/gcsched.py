"""The cyclic garbage collector on a schedule while applying (see the function)."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: Seconds between two garbage collections while applying.
GC_INTERVAL = 10.0

log = logging.getLogger("applier.apply")


@contextmanager
def collect_garbage_on_schedule() -> Iterator[Callable[[float], None]]:
    """Run the cyclic garbage collector every GC_INTERVAL seconds instead of by count.

    Every batch allocates tens of thousands of short-lived objects (messages,
    tuples, change contexts) that reference counting frees; cycles are rare
    (exceptions). Collections triggered by allocation counts walked every
    message still in flight, and their survivors triggered full collections:
    about 10% of the CPU on pgbench (0.13 s of 20,000 transactions). So the
    objects of start-up are frozen (never walked again), the automatic
    collector is off while applying, and the yielded function collects when
    GC_INTERVAL has passed (a full collection then only walks what applying
    keeps alive). The collector's previous state is restored on the way out.
    """
    enabled = gc.isenabled()
    if not gc.get_freeze_count():
        gc.freeze()  # once per process: what start-up built lives as long as it
    gc.disable()
    last = [time.monotonic()]

    def collect(now: float) -> None:
        if now - last[0] >= GC_INTERVAL:
            last[0] = now
            found = gc.collect()
            ms = round((time.monotonic() - now) * 1000, 1)
            log.debug("garbage collected", extra={"ctx": {"ms": ms, "found": found}})

    try:
        yield collect
    finally:
        if enabled:
            gc.enable()
