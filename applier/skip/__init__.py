"""Skip rules, the operator's side: what ``applier skip`` writes and reads on the target.

* :mod:`.store` - the rules in ``applier.skip_rules`` (validated before any
  connection, added, listed, removed) and the changes the worker kept of what
  they skipped, read from ``applier.skipped_changes`` in replay order.
* :mod:`.dump` - those kept changes as SQL to review and replay by hand, or JSON.

The worker's side (loading the rules, deciding what to skip, keeping it) is
:mod:`applier.apply.rules.skiprules`; migration 0006 is the contract between the two.

Imports: the package root's modules (config, errors, lsn, pgconn, redact, schema)
only; never apply/, stream/, bootstrap/ or cli/. Only :mod:`applier.cli` imports it.
"""
