"""The target side of the apply: one session, its connection and what it records there.

* :mod:`.connection` - the target connection and its settings.
* :mod:`.session` - the apply session: prepared statements and the pipelined executor.
* :mod:`.pipeline` - libpq pipeline mode, results matched to the changes that sent them.
* :mod:`.origin` - the replication origin: progress recorded in the same transaction.
* :mod:`.stamp` - the origin stamp on rows (``last_update_wins``).
* :mod:`.insertruns` - the session's runs of INSERTs: multi-row INSERT or COPY.
* :mod:`.holder` - which worker holds the origin (one at a time).
* :mod:`.preflight` - checks before streaming: bootstrap done, source identity, slot.

May import: ``core``, ``sql`` and the layers below ``apply``.
"""
