"""Table sync states a replayed DDL statement changes (:mod:`applier.apply.handlers.ddl`).

:mod:`applier.apply.rules.tablesync` decides from ``applier.table_sync`` whether a
table's changes are applied or held for ``applier sync-tables``. Two captured
statements change that answer:

* a ``CREATE TABLE`` of an included table, replayed: the target's table was made
  by the stream, so every row the stream brings for it is applied (``ready``);
  without this, its first change would find a table the catalog connection does
  not see yet (it is created in the open target transaction) and hold it as
  never copied;
* an ``ALTER PUBLICATION ... ADD TABLE`` naming an included table: its rows from
  before that moment are not in the stream, so it is held (``skipped``, unless a
  sync is under way already) until ``applier sync-tables`` copied it and handed
  it over; the worker starts that command itself (:mod:`applier.apply.handlers.tablefill`).

And one is not the worker's to run: a statement on a table whose rows the worker
holds for ``applier sync-tables`` (:func:`held`) belongs to that table's copy, as
its rows do: the copy takes the definition of its snapshot and sync-tables'
catch-up runs what came after, so the worker running it too would run it twice
(or on a table the target does not have yet).

The rows are written on the catalog connection (autocommit) before the target
transaction commits: replayed again after a crash they are written again, to the
same effect.
"""

from __future__ import annotations

import logging

from applier.apply.rules.tablesync import INF, Name, TableSyncs
from applier.lsn import Lsn

log = logging.getLogger("applier.apply")

_READY = (
    "INSERT INTO applier.table_sync (origin, schema_name, table_name, state) "
    "VALUES (%s, %s, %s, 'ready') ON CONFLICT (origin, schema_name, table_name) DO UPDATE "
    "SET state = 'ready', lsn = NULL, updated_at = pg_catalog.now() "
    "WHERE table_sync.state = 'skipped'"
)
#: ``lsn``: the commit LSN of the transaction that added it: held for the worker's fill.
_HOLD = (
    "INSERT INTO applier.table_sync (origin, schema_name, table_name, state, lsn) "
    "VALUES (%s, %s, %s, 'skipped', %s::pg_lsn) "
    "ON CONFLICT (origin, schema_name, table_name) DO UPDATE "
    "SET state = 'skipped', lsn = excluded.lsn, updated_at = pg_catalog.now() "
    "WHERE table_sync.state IN ('ready', 'skipped')"
)


def created(syncs: TableSyncs, name: Name) -> None:
    """A CREATE TABLE of ``name`` was replayed: its changes are applied."""
    if not syncs.enabled or syncs.conn is None:
        return
    syncs.conn.execute(_READY, (syncs.origin, *name))
    if syncs.states.get(name, ("skipped", None))[0] == "skipped":
        syncs.states[name] = ("ready", None)


def hold(syncs: TableSyncs, name: Name, commit_lsn: Lsn) -> bool:
    """``name`` was added to the publication by the transaction at ``commit_lsn``: hold
    its changes until it is copied (the row says so: applier.apply.handlers.tablefill).
    False when sync is disabled (nothing to hold for)."""
    if not syncs.enabled or syncs.conn is None:
        return False
    syncs.conn.execute(_HOLD, (syncs.origin, *name, str(commit_lsn)))
    state = syncs.states.get(name)
    if state is None or state[0] in ("ready", "skipped"):
        syncs.states[name] = ("skipped", commit_lsn)
        for oid, known in syncs.names.items():
            if known == name and syncs.cut.get(oid) != INF:
                syncs.cut[oid] = INF
                syncs.generation += 1
    log.info(
        "table added to the publication: its changes are held until it is copied",
        extra={"ctx": {"table": f"{name[0]}.{name[1]}"}},
    )
    return True


def held(syncs: TableSyncs, name: Name, commit_lsn: Lsn) -> bool:
    """Whether the rows of ``name`` in a transaction committing at ``commit_lsn`` are
    left to sync-tables (the rule of the cut: skipped while ``commit_lsn < cut``)."""
    if not syncs.enabled:
        return False
    state = syncs.states.get(name)
    if state is None or state[0] == "ready":
        return False
    if state[0] == "syncdone":
        return state[1] is not None and commit_lsn < state[1]
    return True
