"""Status: the worker's row, what ``applier status`` reports of it, and the health verdict.

* :mod:`.row` - :class:`~.row.WorkerState`, the running worker's row in
  ``applier.worker_status`` (state, heartbeat, counters, lag, the last error),
  written on its own autocommit connection.
* :mod:`.report` - ``applier status``: the slot, the origin's progress, that
  row, conflicts, skip rules and lag, read (never written) and printed as a
  table or JSON; :func:`~.report.collect` is what ``applier cutover`` reads too.
* :mod:`.health` - the verdict of a :class:`~.report.Status`: status's exit
  code (0, 1, 3, 4, 5), its name, why and what to do; :data:`~.health.STALE_INTERVALS`
  says when a heartbeat is stale (for the worker's holder check as well).

Imports: the package root's modules (config, console, errors, lag, lsn, pgconn,
redact) only; never apply/, stream/, bootstrap/ or cli/. The worker
(:mod:`applier.apply`) imports :mod:`.row` and :mod:`.health`, ``applier
cutover`` imports :mod:`.report` and :mod:`.health`; nothing here runs on
import, so the worker does not load what ``status`` prints with.
"""
