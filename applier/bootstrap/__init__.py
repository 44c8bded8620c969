"""``applier bootstrap``: copy the included tables from an exported snapshot (Spark job).

Modules: :mod:`.plan` finds the tables and cuts them into ctid slices,
:mod:`.copy_task` is what one Spark task runs, :mod:`.schema` creates missing
tables from ``pg_dump``, :mod:`.sequences` copies sequence values,
:mod:`.progress` shows it to people, :mod:`.spark` builds, starts and stops
the SparkContext, and :mod:`.job` puts them in order (its docstring has the
design: snapshot lifetime, idempotent slices, reruns and the hand-off to
``applier run``).
"""
