"""What may be applied, and how a conflict ends.

* :mod:`.conflicttype` - the conflict types: one enum.
* :mod:`.conflicts` - the statements that detect conflicts.
* :mod:`.conflictlog` - the conflict log: a conflict's row and its JSON.
* :mod:`.policies` - the per-conflict-type policies from the config.
* :mod:`.resolve` - a met conflict resolved by its policy.
* :mod:`.skiprules` - ``applier skip`` rules: transactions and rows left out.
* :mod:`.originfilter` - changes that came from an origin we do not apply.
* :mod:`.tablesync` - tables still being copied by ``sync-tables``.

May import: ``batching``, ``target``, ``core``, ``sql`` and the layers below ``apply``.
"""
