"""From a source change to target SQL, without I/O.

* :mod:`.mapping` - source relation -> target table and columns, type checks.
* :mod:`.stmt` - a prepared statement and the SQL pieces every builder uses.
* :mod:`.planner` - (mapping, change) -> (prepared statement, parameters).
* :mod:`.copyrun` - a run of INSERTs as COPY data (text or binary).
* :mod:`.replan` - plans rebuilt after the target's catalog changed.

May import: the layers below ``apply`` only.
"""
