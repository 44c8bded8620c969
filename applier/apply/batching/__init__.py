"""The fast lanes: many changes sent as one statement or one COPY.

* :mod:`.paths` - the one decision of which path a table's changes may take in a
  transaction; every lane asks it, none re-lists the rules.
* :mod:`.copylane`, :mod:`.copyrun` - INSERT runs sent as binary COPY.
* :mod:`.insertlane`, :mod:`.insertruns` - INSERT runs sent as multi-row INSERT.
* :mod:`.mergelane`, :mod:`.merge` - UPDATE/DELETE runs merged into one statement.
* :mod:`.fullident` - changes of REPLICA IDENTITY FULL tables, batched.
* :mod:`.host` - what the path decision and the lanes read of the engine (Protocols).

May import: ``sql``, ``target``, ``handlers.states`` and the layers below ``apply``.
"""
