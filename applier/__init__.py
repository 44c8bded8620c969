"""applier: an external PostgreSQL logical replication subscriber.

Layers, imported one way only::

    protocol  (bytes -> typed messages, no I/O)
      -> stream   (owns the replication connection)
      -> apply    (messages -> SQL on the target, progress in a replication origin)
      -> bootstrap / verify (Spark jobs)
      -> cli, config (the edge)
"""

__version__ = "0.1.0"
