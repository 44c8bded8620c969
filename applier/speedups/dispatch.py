"""The apply worker's loop over a batch in Python: the twin of ``dispatch_batch``
in dispatch.c.

:func:`dispatch_batch` hands each message of a batch to its handler straight
when Applier.dispatch's common path is open, else to Applier.dispatch itself
(``fallback``), for :class:`applier.apply.worker.Worker`, which uses the
chosen function. Everything it reads it is given to call: it knows no
attribute of the applier or the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Flag", "dispatch_batch"]


class Flag:
    """A stop request: false until :meth:`set` (the twin of dispatch.c's Flag)."""

    __slots__ = ("_on",)

    def __init__(self) -> None:
        self._on = False

    def set(self) -> None:
        self._on = True

    def clear(self) -> None:
        self._on = False

    def __bool__(self) -> bool:
        return self._on


def dispatch_batch(
    batch: list[Any],
    handlers: dict[type, Any],
    open_state: Callable[[], Any],
    fallback: Callable[[Any, Any], object],
    stop: object,
) -> None:
    """For each ``(lsn, msg)`` of ``batch``, in order: ``handler(lsn, msg)`` when
    ``handlers[type(msg)]`` is ``(states, handler)`` and ``open_state()`` (the session's
    state while the common path is open, else None) is in ``states``; any other
    message to ``fallback(lsn, msg)``, which raises or drops the live transaction as
    Applier.dispatch does. After each message, stop when the flag ``stop`` is set.
    """
    if not isinstance(batch, list) or not isinstance(handlers, dict) or type(stop) is not Flag:
        raise TypeError(
            "dispatch_batch(batch: list, handlers: dict, open_state, fallback, stopping)"
        )
    for lsn, msg in batch:
        entry = handlers.get(type(msg))
        call = fallback
        if isinstance(entry, tuple) and len(entry) == 2 and open_state() in entry[0]:
            call = entry[1]
        call(lsn, msg)
        if stop:
            break
