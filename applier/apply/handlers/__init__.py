"""What each pgoutput message does to the apply session.

* :mod:`.dispatch` - the engine (:class:`~.dispatch.Applier`): one message in, the
  transaction state moved on, the change handed to a lane or the row-by-row path.
  It owns its parts (below) and gives each the Protocol of what it uses.
* :mod:`.ports` - the services the parts call each other by (Protocols).
* :mod:`.groupcommit` - several source transactions in one target transaction.
* :mod:`.changes` - INSERT/UPDATE/DELETE/TRUNCATE of a committed transaction.
* :mod:`.streamed` - streamed (in-progress) transactions, spooled or applied live.
* :mod:`.twophase` - PREPARE / COMMIT PREPARED / ROLLBACK PREPARED.
* :mod:`.relations` - Relation and Type messages: the source's catalog as it streams.
* :mod:`.until` - ``applier run --until``: where a run stops.
* :mod:`.spool` - streamed transactions kept on disk until their end.

May import: ``rules``, ``batching``, ``target``, ``core``, ``sql`` and the layers
below ``apply`` (``protocol``, ``lsn``, ``errors``); never the worker loop above it.
"""
