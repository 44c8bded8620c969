"""Checks before a session streams: no bootstrap in the way, the right source, the right slot.

Why
===

The origin's progress is an LSN of one source's WAL, and the slot is what
keeps that WAL from the progress onwards. If either is not what the origin
was built from, START_REPLICATION still succeeds and rows are lost without a
word: the walsender silently moves a start position below the slot's
``confirmed_flush_lsn`` up to it, and another source's LSNs mean nothing.
So before each session (:meth:`applier.apply.worker.Worker._session`) the
worker checks, in this order, and changes nothing on either side until all
pass:

0. **The source's version can do what the config asks**
   (:func:`applier.stream.versions.check_source`): ``[source] failover``
   needs PostgreSQL 17+, else :class:`~applier.errors.ConfigError`, exit 2.
   **The publications exist** (:func:`applier.refusal.check_publications`):
   pgoutput looks them up only when the first change arrives, so a
   misspelled name would pass START_REPLICATION, log "connected" and fail
   later; refused here (exit 2), naming the missing and the existing ones.
1. **No unfinished bootstrap of the slot** (``applier.bootstrap_run`` phase
   other than ``done``). Applying onto half-copied tables drops UPDATEs of
   rows not copied yet as "missing" and confirms positions; the bootstrap's
   hand-off then moves the origin back. :class:`BootstrapUnfinished`,
   exit 3: a restart cannot finish the bootstrap, a person must rerun
   ``applier bootstrap`` (it continues where it stopped), so systemd must
   not restart ``run`` in a loop meanwhile (``RestartPreventExitStatus=2 3``);
   once the bootstrap is done, ``systemctl start`` runs it.
2. **The same source** (``applier.source_identity``, one row per origin,
   recorded on the first start of ``run`` and by the bootstrap when it
   creates the slot): IDENTIFY_SYSTEM's system identifier and database must
   match, else :class:`~applier.errors.SourceMismatch` (exit 3).
   A *timeline* change with the same system identifier is a promotion
   (failover to a physical standby, point-in-time recovery). It is accepted
   only when the recorded timeline is an ancestor in the new timeline's
   history (TIMELINE_HISTORY) and the origin's progress is not past the
   point where the new timeline branched off: otherwise the target holds
   changes the source no longer has (a standby that was behind, a restore to
   an earlier point), which a restart cannot repair. A lower timeline is an
   older incarnation of the source: refused. An accepted change is logged
   and recorded. (A physical standby has the slot only if it was synced,
   PG17+ failover slots; if it is not there, check 3 fires.)
3. **The slot.** Absent: created (at the current position, no snapshot)
   *only* when the origin has no progress yet, i.e. nothing was ever
   applied, so no change can fall between the progress and the new slot.
   Absent with progress (a failover, a dropped slot, a renamed slot in the
   config, a restored source): :class:`~applier.errors.SlotMissing`, exit 3,
   naming slot, origin and progress, with the way out (re-bootstrap).
   Present: it must be a logical slot of plugin ``pgoutput`` in the
   configured database (slot names are cluster-wide). With ``[source]
   failover = true`` a slot created without it is altered to fail over
   (ALTER_REPLICATION_SLOT, 17+); ``false`` never turns off a failover slot.

Not a check but said here, once per process: large objects on the source
(the stream cannot carry them; :func:`applier.largeobjects.note_not_carried`
says what copies them).

Not detected: a slot dropped and re-created under the same name by someone
else, while the origin has progress. Its ``confirmed_flush_lsn`` is then past
the progress, but so is ours in normal operation (idle confirmations move it
past the last applied commit), so the two cannot be told apart.

The bootstrap side: :func:`record_source` (when the slot is created) and
:func:`check_slot_not_moved` (its hand-off refuses a slot some other consumer
advanced past the consistent point: those changes are gone for us).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from applier import largeobjects
from applier.config import Config
from applier.errors import (
    BootstrapUnfinished,
    SlotMissing,
    SlotMoved,
    SourceMismatch,
)
from applier.lsn import Lsn
from applier.refusal import check_publications
from applier.stream import versions
from applier.stream.replconn import ReplicationConnection, SlotState, SystemInfo

log = logging.getLogger("applier.apply")

Conn = psycopg.Connection[Any]

REBOOTSTRAP = (
    "re-bootstrap the target with `applier bootstrap --recreate-slot --truncate` "
    "(see the README, 'Exit codes and what to do')"
)


def check_before_streaming(
    target: Conn, repl: ReplicationConnection, cfg: Config, progress: Lsn
) -> None:
    """All checks of the module docstring, in order; creates the slot if that is safe."""
    slot, origin = cfg.source.slot, cfg.origin
    versions.check_source(
        repl.server_version, failover=cfg.source.failover, binary=cfg.apply.binary
    )
    check_publications(cfg.source.publications, repl.publications())
    check_no_unfinished_bootstrap(target, slot)
    largeobjects.note_not_carried(int(repl.command(largeobjects.count_sql())[0][0]))
    info = repl.identify_system()
    check_source(target, repl, origin, slot, info, progress)
    state = repl.slot_state(slot)
    if state is None:
        if progress:
            raise SlotMissing(
                f"replication slot {slot!r} does not exist, but origin {origin!r} has "
                f"progress {progress}: the source's changes after it are gone with the slot",
                hint=f"{REBOOTSTRAP}; a new slot would silently skip them",
                slot=slot,
                origin=origin,
                progress=progress,
            )
        repl.create_slot(
            slot,
            snapshot="nothing",
            two_phase=cfg.apply.two_phase,
            failover=cfg.source.failover,
        )
        return
    check_slot(state, info, slot)
    if cfg.source.failover and not state.failover:
        # The config asks for a slot that survives a failover: make it one (the
        # slot is not in use by us yet; ALTER refuses an active one). The reverse,
        # failover = false on a failover slot, is left alone: false is the default,
        # not a request to undo what someone set.
        repl.set_slot_failover(slot, True)


def check_no_unfinished_bootstrap(target: Conn, slot: str) -> None:
    row = target.execute(
        "SELECT phase, started_at FROM applier.bootstrap_run WHERE slot = %s AND phase <> 'done'",
        (slot,),
    ).fetchone()
    if row is not None:
        raise BootstrapUnfinished(
            f"a bootstrap of slot {slot!r} is unfinished (phase {row[0]}, started {row[1]}); "
            "applying now would write onto half-copied tables",
            hint="finish it with `applier bootstrap` (a rerun continues where it stopped), "
            "then start `applier run`",
            slot=slot,
        )


def check_slot(state: SlotState, info: SystemInfo, slot: str) -> None:
    """The slot that exists is a logical pgoutput slot of our database."""
    problem = None
    if state.slot_type != "logical":
        problem = f"is a {state.slot_type} slot, not a logical one"
    elif state.plugin != "pgoutput":
        problem = f"uses the output plugin {state.plugin!r}, not 'pgoutput'"
    elif info.dbname is not None and state.database != info.dbname:
        problem = f"belongs to database {state.database!r}, not {info.dbname!r}"
    if problem:
        raise SlotMissing(
            f"replication slot {slot!r} {problem}",
            hint="set source.slot to applier's slot (or drop that slot and re-bootstrap: "
            f"{REBOOTSTRAP})",
            slot=slot,
        )


# -- the source's identity -------------------------------------------------------------


def check_source(
    target: Conn,
    repl: ReplicationConnection,
    origin: str,
    slot: str,
    info: SystemInfo,
    progress: Lsn,
) -> None:
    """Refuse another source than the origin's; record it on the first start."""
    row = target.execute(
        "SELECT system_identifier, timeline, dbname FROM applier.source_identity WHERE origin = %s",
        (origin,),
    ).fetchone()
    if row is None:
        record_source(target, origin, slot, info)
        return
    sysid, timeline, dbname = str(row[0]), int(row[1]), str(row[2])
    if sysid != info.systemid or dbname != info.dbname:
        what = (
            f"system identifier {info.systemid}, not {sysid}"
            if sysid != info.systemid
            else f"database {info.dbname!r}, not {dbname!r}"
        )
        raise SourceMismatch(
            f"the source is not the one origin {origin!r} replicates from: it has {what}",
            hint="fix source.dsn; to replicate from this source instead, " + REBOOTSTRAP,
            origin=origin,
        )
    if info.timeline != timeline:
        _check_timeline(repl, origin, timeline, info.timeline, progress)
        target.execute(
            "UPDATE applier.source_identity SET timeline = %s, timeline_changed_at = now() "
            "WHERE origin = %s",
            (info.timeline, origin),
        )


def _check_timeline(
    repl: ReplicationConnection, origin: str, old: int, new: int, progress: Lsn
) -> None:
    """A promotion is fine if the new timeline branched off the old one after our progress."""
    branch = None
    if new > old:
        branch = next((lsn for tli, lsn in repl.timeline_history(new) if tli == old), None)
    if branch is None or progress > branch:
        where = (
            f"branched off timeline {old} at {branch}, before the origin's progress {progress}"
            if branch is not None
            else f"does not descend from timeline {old}"
        )
        raise SourceMismatch(
            f"the source's timeline {new} {where}: the target holds changes the source "
            "no longer has",
            hint=REBOOTSTRAP,
            origin=origin,
        )
    log.warning(
        "the source changed timeline (a promotion); the origin's progress is on the new one",
        extra={"ctx": {"origin": origin, "from": old, "to": new, "branch_lsn": branch}},
    )


def record_source(target: Conn, origin: str, slot: str, info: SystemInfo) -> None:
    """Record (or, for a new slot of a bootstrap, replace) the origin's source."""
    target.execute(
        "INSERT INTO applier.source_identity (origin, system_identifier, timeline, dbname, slot) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (origin) DO UPDATE SET "
        "system_identifier = excluded.system_identifier, timeline = excluded.timeline, "
        "dbname = excluded.dbname, slot = excluded.slot, recorded_at = now(), "
        "timeline_changed_at = NULL",
        (origin, info.systemid, info.timeline, info.dbname or "", slot),
    )
    log.info(
        "source recorded",
        extra={"ctx": {"origin": origin, "system_identifier": info.systemid, "db": info.dbname}},
    )


# -- the bootstrap's hand-off ----------------------------------------------------------------


def check_slot_not_moved(slot: str, confirmed: Lsn | None, consistent: Lsn) -> None:
    """Before the origin is set to the consistent point: nobody consumed the slot meanwhile."""
    if confirmed is not None and confirmed > consistent:
        raise SlotMoved(
            f"replication slot {slot!r} has moved past the bootstrap's consistent point "
            f"{consistent} (confirmed_flush_lsn {confirmed}): another consumer confirmed "
            "changes the target never got",
            hint="stop whatever reads the slot (an `applier run` started too early, "
            "pg_recvlogical), then " + REBOOTSTRAP,
            slot=slot,
        )
