"""Schema changes captured on the source and replayed on the target (issue 33).

PostgreSQL's logical decoding carries rows, not DDL. applier carries DDL the
way it carries rows: inside the source transaction, at its position, as a
*transactional* logical decoding message (``pg_logical_emit_message(true,
'applier.ddl', ...)``), so the worker runs it in the same target transaction as
the changes around it and the replication origin's progress makes it
exactly-once with the data.

* :mod:`.message` - the message's one format (JSON), written by the source's
  event trigger and by ``applier ddl run``, read by the worker.
* :mod:`.capture` - the event trigger and its functions (SQL, versioned), what
  of them a source has (``applier status``), install and uninstall.
* :mod:`.source` - ``applier ddl install`` / ``uninstall``: the connection,
  the superuser check, the line saying what was done.
* :mod:`.run` - ``applier ddl run``: a statement and its message in one
  source transaction.
"""
