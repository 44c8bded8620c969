"""The fast lanes: many changes sent as one statement or one COPY.

* :mod:`.paths` - the one decision of which path a table's changes may take in a
  transaction; every lane asks it, none re-lists the rules.
* :mod:`.copylane` - INSERT runs sent as COPY (framed by ``sql.copyrun``).
* :mod:`.insertlane` - INSERT runs taken past the handlers into the session's
  runs (``target.insertruns``: multi-row INSERT or COPY).
* :mod:`.mergelane`, :mod:`.merge` - UPDATE/DELETE runs merged into one statement.
* :mod:`.fullident` - changes of REPLICA IDENTITY FULL tables, batched.
* :mod:`.host` - what the path decision and the lanes read of the engine (Protocols).

May import: ``target``, ``core``, ``sql`` and the layers below ``apply``.
"""
