"""The engine's shared vocabulary: what every layer of ``apply`` speaks of.

* :mod:`.states` - the transaction in hand (:class:`~.states.Txn`), the contexts
  of a change (one row, a lane's row, a merged statement's rows), the session
  states and the one table of moves between them.
* :mod:`.tally` - the counters of applied, skipped and retried work.

May import: ``sql`` (a transaction's mappings and keys) and the layers below
``apply``; everything in ``apply`` may import it.
"""
