"""The bootstrap's copy of large objects (:mod:`applier.largeobjects`), under its snapshot.

Where it runs: in the driver, after the Spark copy of the tables, while the
replication connection still holds the exported snapshot. The driver's
source session imports that snapshot (``SET TRANSACTION SNAPSHOT``), so the
objects are the source's at the slot's consistent point: one created after
it arrives at cutover (:func:`applier.largeobjects.sync`), never twice.
Not as Spark tasks: measured on 2000 small objects and one 200 MB object
(README, "Large objects"), the driver copies at the speed of one session
pair, and the work is one scan of a catalog plus sequential reads that
slices by OID range would only split into more round trips.

Checks (:func:`check`, with every other refusal, before anything changes):
the roles the objects need on the target (owners, grantees, grantors), and
objects the target has already with other data, owner or ACL (an interrupted
run's objects are equal and skipped; anything else is named, exit 3, unless
``--truncate``: then they are replaced, as the tables are emptied).

``[bootstrap] large_objects = false``: nothing is copied, and the bootstrap
says once how many there are and that cutover copies them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
from psycopg import sql

from .. import largeobjects as lo
from ..config import Config
from ..errors import BootstrapError, BootstrapRefused

log = logging.getLogger(__name__)
Conn = psycopg.Connection[Any]

NOT_COPIED = (
    "the source has {n} large object(s); bootstrap does not copy them "
    "([bootstrap] large_objects = false) and the stream cannot carry them: "
    "`applier cutover` copies them once writes have stopped"
)


def check(cfg: Config, src: Conn, tgt: Conn, *, replace: bool = False) -> None:
    """Refuse, before anything changes, what would stop the copy half-way.

    ``replace`` (``--truncate``): objects the target has with other data are
    copied again (unlinked first), as the tables are emptied, not refused.
    """
    if not cfg.bootstrap.large_objects:
        n = lo.count(src)
        if n:
            log.warning(NOT_COPIED.format(n=n))
        return
    objects = lo.metadata(src)
    if not objects:
        return
    _refuse_missing_roles(tgt, objects)
    if not replace:
        _refuse(_present(src, tgt, objects)[1])


def _refuse_missing_roles(tgt: Conn, objects: list[lo.LargeObject]) -> None:
    try:
        lo.refuse_missing_roles(tgt, objects, "bootstrap")
    except lo.LargeObjectError as e:
        raise BootstrapRefused(e.message, hint=e.hint) from None


def _present(src: Conn, tgt: Conn, objects: list[lo.LargeObject]) -> tuple[list[int], list[int]]:
    """The OIDs the target has already: (equal to the source's, differing)."""
    there = lo.digests(tgt, [o.oid for o in objects])
    if not there:
        return [], []
    here = lo.digests(src, list(there))
    differing = sorted(o for o in there if here.get(o) != there[o])
    return sorted(set(there) - set(differing)), differing


def _refuse(differing: list[int]) -> None:
    if differing:
        shown = ", ".join(str(o) for o in differing[:20])
        more = f" and {len(differing) - 20} more" if len(differing) > 20 else ""
        raise BootstrapRefused(
            f"the target has large object(s) {shown}{more} with other data, owner or ACL "
            "than the source's",
            hint="unlink them on the target (SELECT pg_catalog.lo_unlink(oid)) if they are "
            "not needed and rerun, or rerun with --truncate to have them replaced",
        )


def copy(cfg: Config, src: Conn, tgt: Conn, snapshot: str, *, replace: bool = False) -> lo.Copied:
    """Copy every large object as of ``snapshot`` (the slot's exported snapshot);
    ``replace``: as in :func:`check`. A server's error is a :class:`BootstrapError`
    (as a slice's: the batches committed stay, a rerun skips them)."""
    if not cfg.bootstrap.large_objects:
        return lo.Copied()
    try:
        return _copy(src, tgt, snapshot, replace)
    except lo.CopyFailed as e:
        raise BootstrapError(e.message) from None
    except psycopg.Error as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BootstrapError(f"copying the large objects failed: {msg}") from None


def _copy(src: Conn, tgt: Conn, snapshot: str, replace: bool) -> lo.Copied:
    started = time.monotonic()
    src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        src.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        objects = lo.metadata(src)
        _refuse_missing_roles(tgt, objects)  # a role new since check()
        # A rerun after a crash finds the batches it committed: equal, skipped.
        equal, differing = _present(src, tgt, objects) if objects else ([], [])
        if not replace:
            _refuse(differing)
        skip = set(equal) | set(differing)
        done = lo.copy_objects(src, tgt, [o for o in objects if o.oid not in skip], replace=False)
        by_oid = {o.oid: o for o in objects}
        again = lo.copy_objects(src, tgt, [by_oid[o] for o in differing], replace=True)
        done.objects += again.objects
        done.bytes += again.bytes
    finally:
        src.execute("ROLLBACK")
    if objects:
        log.info(
            "large objects copied",
            extra={"ctx": {"objects": done.objects, "bytes": done.bytes,
                           "already_there": len(equal), "replaced": len(differing),
                           "seconds": round(time.monotonic() - started, 2)}},
        )  # fmt: skip
    return done
