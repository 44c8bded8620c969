"""The apply engine: pgoutput changes applied to the target exactly once (``applier run``).

* :mod:`.worker` - the run loop, the message state machine and the design essay.
* :mod:`.planner` - pure (mapping, change) -> (prepared statement, parameters).
* :mod:`.mapping` - source relation -> target table/columns, type checks.
* :mod:`.session` - target session set-up and the pipelined executor.
* :mod:`.origin` - replication origin progress and the flush position we report.
* :mod:`.spool` - streamed transactions spooled until their commit.
* :mod:`.state` - the worker's row in ``applier.worker_status``.
* :mod:`.preflight` - checks before streaming: bootstrap, source identity, slot.
"""
