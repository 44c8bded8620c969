"""One batch of decoded messages handed to the handlers: the worker's inner loop.

The common path goes straight to each message's handler through
``dispatch_batch`` (:mod:`applier.speedups`, C or its Python twin): it is
given what it reads (the handler table, a callable saying whether the
applier's common path is open, the stop :class:`~applier.speedups.Flag`) and
reads no attribute of ours. With ``run --until`` every message first passes
:meth:`~applier.apply.handlers.until.Until.admit`, in Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from applier.apply.core.states import open_state_of
from applier.speedups import Flag, dispatch_batch

if TYPE_CHECKING:
    from applier.apply.handlers.dispatch import Applier
    from applier.apply.handlers.until import Until
    from applier.lsn import Lsn


class BatchDispatch:
    """The worker's batches to the handlers, and the stop request between messages."""

    def __init__(self) -> None:
        # The flag dispatch_batch reads between messages, without a call.
        self._stop = Flag()

    @property
    def stopping(self) -> bool:
        """A stop was asked for: the loops end after the message in hand."""
        return bool(self._stop)

    @stopping.setter
    def stopping(self, on: bool) -> None:
        if on:
            self._stop.set()
        else:
            self._stop.clear()

    def dispatch(
        self,
        batch: list[tuple[Lsn, Any]],
        applier: Applier | None,
        until: Until | None,
        dispatch: Callable[[Lsn, Any], None],
    ) -> None:
        """``batch`` to ``dispatch`` (Applier.dispatch), stopping after the message
        during which a stop was asked for."""
        if until is None and applier is not None:
            # Applier.dispatch's common path straight to the handlers, the rest
            # through it (applier/speedups/dispatch.c or .py).
            dispatch_batch(batch, applier.handlers, open_state_of(applier), dispatch, self._stop)
            return
        for lsn, msg in batch if until is None else until.admit(batch, applier):
            dispatch(lsn, msg)
            if self.stopping:
                break
