"""The conflict log: each conflict met becomes a row of ``applier.conflict_log``.

Detection (the statements that see a conflict) is :mod:`applier.apply.rules.conflicts`;
what a policy does with it, :mod:`applier.apply.rules.resolve`. This module is the
record: what one conflict holds, how its row is written, and the JSON of the rows
and keys it names (the skipped-changes log writes its rows with the same JSON).

Records
=======

Every conflict becomes a row of ``applier.conflict_log``, sent in the target
transaction that keeps the change's outcome, after its results were read and
before its commit (:meth:`TargetSession.read_checks`): a rolled-back group
leaves none and its replay writes them once. The unique key (origin, commit
LSN, change number, type) and ``ON CONFLICT DO NOTHING`` keep a conflict that
stops the worker (written on its own, see the worker) from being written twice.

One exception keeps pipelined commits pipelined: on a table without a
``[conflicts]`` policy, a row an UPDATE or DELETE did not find is only
recorded (and logged), so the commit does not wait for those results (the wait
was a third of the pgbench loop). Such a record is written once the commit
succeeded, on the catalog connection (or inside the next target transaction
when its result was read before that one's commit); a crash in between loses
the record, never a row, and the warning is logged either way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from applier.apply.rules.conflicttype import ConflictType
from applier.apply.sql.mapping import RelMap
from applier.apply.sql.planner import Params, Stmt, identity_tuple
from applier.lsn import Lsn
from applier.protocol import Delete, Insert, TupleData, Update

_U = ord("u")


def row_json(rm: RelMap, tup: TupleData | None, idx: tuple[int, ...] | None = None) -> str | None:
    """A tuple as a jsonb text: column -> the text the source sent (``\\x..`` for binary
    values); an unchanged TOAST value (not sent) is left out."""
    if tup is None:
        return None
    cols = rm.relation.columns
    out: dict[str, str | None] = {}
    for i in range(len(tup.kinds)) if idx is None else idx:
        kind = tup.kinds[i]
        if kind == _U:
            continue
        v = tup.values[i]
        if v is None:
            out[cols[i].name] = None
        elif kind == ord("b"):
            out[cols[i].name] = "\\x" + v.hex()
        else:
            out[cols[i].name] = v.decode("utf-8", "replace")
    return json.dumps(out, ensure_ascii=False)


def key_json(rm: RelMap, change: Any) -> str | None:
    """The identity values of a change (every column for FULL)."""
    tup = identity_tuple(change)
    return None if tup is None else row_json(rm, tup, rm.key or None)


def remote_json(change: Any, rm: RelMap) -> str | None:
    if isinstance(change, (Insert, Update)):
        return row_json(rm, change.new)
    if isinstance(change, Delete):
        return row_json(rm, change.old)
    return None


@dataclass(slots=True)
class Conflict:
    """One conflict met, waiting for its transaction's end to be written."""

    ctx: Any  # the ChangeCtx
    kind: ConflictType
    resolution: str
    local_row: str | None


#: The record of a conflict (see "Records"); parameters in this order.
LOG_CONFLICT = Stmt(
    b"applier_conflict_log",
    b"INSERT INTO applier.conflict_log (origin, xid, commit_lsn, end_lsn, change_lsn, "
    b"change_no, schema_name, table_name, conflict, resolution, key, local_row, remote_row) "
    b"VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) "
    b"ON CONFLICT (origin, commit_lsn, change_no, conflict) DO NOTHING",
    (25, 20, 3220, 3220, 3220, 23, 25, 25, 25, 25, 3802, 3802, 3802),
    (),
    (),
    False,
    False,
)


def conflict_params(origin: str, c: Conflict) -> Params:
    ctx = c.ctx
    txn = ctx.txn
    rm = ctx.rm
    return [
        origin.encode(),
        None if ctx.xid is None else str(ctx.xid).encode(),
        str(Lsn(txn.commit_lsn)).encode(),
        None if txn.end_lsn is None else str(Lsn(txn.end_lsn)).encode(),
        str(Lsn(ctx.lsn)).encode(),
        str(ctx.no).encode(),
        rm.relation.namespace.encode(),
        rm.relation.name.encode(),
        c.kind.value.encode(),  # one of the CHECK of conflict_log.conflict
        c.resolution.encode(),
        as_param(key_json(rm, ctx.change)),
        as_param(c.local_row),
        as_param(remote_json(ctx.change, rm)),
    ]


def as_param(s: str | None) -> bytes | None:
    """A text parameter (None: NULL)."""
    return None if s is None else s.encode()
