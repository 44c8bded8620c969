"""The apply engine: pgoutput changes applied to the target exactly once (``applier run``).

Data flows one way through it: the stream hands decoded messages to the worker
loop, the handlers move the transaction state and pick a path for each change,
the SQL layer turns a change into a statement, the target session sends it, and
the origin records progress in the same target transaction.

The process, in this package's own modules:

* :mod:`.worker` - the run loop: a session's life, the batches, the design essay.
* :mod:`.connect` - one session's connections: status row, origin, checks, stream.
* :mod:`.batchdispatch` - one batch of messages to the handlers (C or Python).
* :mod:`.backoff` - retries of transient faults, their spacing and their log.
* :mod:`.confirm`, :mod:`.beat` - flushed positions confirmed to the source; the
  heartbeat, watchdog and status row.
* :mod:`.gcsched` - the garbage collector run between batches, not inside them.

Its layers, each importing only those below it (``tests/packaging/test_layers.py``):

* :mod:`.handlers` - what each message does; the ``Applier`` and its parts.
* :mod:`.rules` - conflicts and their policies, skip rules, origin filter, table sync.
* :mod:`.batching` - the one decision of which path a change may take, and the lanes.
* :mod:`.target` - the target session, its connection, origin, stamps, insert runs.
* :mod:`.core` - the transaction in hand, change contexts, session states, counters.
* :mod:`.sql` - mapping and planning: change -> statement or COPY data, no I/O.
"""
