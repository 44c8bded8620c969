"""The apply engine: pgoutput changes applied to the target exactly once (``applier run``).

Data flows one way through it: the stream hands decoded messages to the worker
loop, the handlers move the transaction state and pick a path for each change,
the SQL layer turns a change into a statement, the target session sends it, and
the origin records progress in the same target transaction.

* :mod:`.worker` - the run loop: connect, take the origin, stream, retry; the design essay.
* :mod:`.connect`, :mod:`.backoff` - one session's connections; the retries around them.
* :mod:`.handlers` - what each message does (dispatch, row changes, streamed, two-phase,
  relations, until) and the session's states.
* :mod:`.batching` - the fast lanes (COPY runs, multi-row INSERT, merged UPDATE/DELETE,
  FULL identity) and the one decision of which path a change may take.
* :mod:`.sql` - mapping and planning: change -> statement, no I/O.
* :mod:`.rules` - conflicts and their policies, skip rules, origin filter, table sync.
* :mod:`.target` - the target session, connection, origin, stamp, confirm, heartbeat.
* :mod:`.state` - the worker's row in ``applier.worker_status``.

Which may import which: ``worker`` -> ``handlers`` -> ``batching``/``rules`` ->
``target`` -> ``sql``; nothing imports upward, and nothing outside ``apply``
imports a private name from it.
"""
