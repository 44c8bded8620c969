"""Opening the pool for one worker session: the members' origins, sessions and Appliers.

The worker calls :func:`open_leader` once per session when ``[apply] workers``
is above 1, after its own (home) session took the plain origin: holding it is
what keeps a second worker out, so a member's origin held by someone else can
only be a backend of this worker's previous process that has not ended yet
(a transient wait, as for the plain origin).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import psycopg

from applier.apply.handlers.dispatch import Applier
from applier.apply.handlers.spool import SpoolSet
from applier.apply.parallel.leader import Leader
from applier.apply.parallel.member import Item, Member, Report
from applier.apply.parallel.origins import check_capacity, create_group, member, trim_group
from applier.apply.parallel.pool import RUN_LIMIT, Pool, PoolStats, member_applier
from applier.apply.parallel.turn import CommitTurn
from applier.apply.rules.skiprules import SkipRules
from applier.apply.rules.tablesync import TableSyncs
from applier.apply.sql.mapping import Catalog
from applier.apply.target.holder import OBJECT_IN_USE
from applier.apply.target.session import TargetSession, connect
from applier.config import Config
from applier.errors import ConnectionLost, TransientError
from applier.lag import PendingCommits
from applier.lsn import Lsn
from applier.pgconn import close_quietly

log = logging.getLogger("applier.apply")


def open_leader(
    cfg: Config,
    home: Applier,
    catalog: psycopg.Connection[Any],
    spools: SpoolSet,
    rules: SkipRules,
    our_origin_id: int | None,
    pending: PendingCommits,
    syncs: TableSyncs,
    stopping: Callable[[], bool],
    past: PoolStats | None,
) -> Leader:
    """The leader over ``home`` and a pool of ``[apply] workers`` members (``past``:
    the counters of the worker's earlier pools)."""
    n = cfg.apply.workers
    gone = trim_group(catalog, cfg.origin, n)
    if gone:
        log.info(
            "origins of sessions beyond [apply] workers dropped", extra={"ctx": {"origins": gone}}
        )
    check_capacity(catalog, cfg.origin, n)
    created = create_group(catalog, cfg.origin, n)
    if created:
        log.info("origins of the apply sessions created", extra={"ctx": {"origins": created}})

    def members(turn: CommitTurn, report: Callable[[Report], None]) -> list[Member]:
        # Opened at once (each is a few round trips to the target); all or none.
        with ThreadPoolExecutor(n, thread_name_prefix="applier open") as ex:
            futures = [
                ex.submit(_member, cfg, i, home, spools, rules, our_origin_id, turn, report)
                for i in range(1, n + 1)
            ]
            wait(futures)
        opened = [f.result() for f in futures if f.exception() is None]
        failed = [f.exception() for f in futures if f.exception() is not None]
        if failed:
            for m in opened:
                m.session.close()
                close_quietly(m.catalog, "catalog")
            raise failed[0]  # type: ignore[misc]
        return opened

    def on_commit(item: Item, local: Lsn, flushed: Lsn) -> None:
        # In source order (the pool takes results in commit order): as one session would.
        home.flush.store(item.end_lsn, local)
        if flushed > home.session.flushed_seen:  # what confirm releases with (confirm.py)
            home.session.flushed_seen = flushed
        home.applied_txns += 1
        home.last_commit_lsn = item.end_lsn
        home.last_commit_ts = item.commit_ts
        home.progress = Lsn(max(home.progress, item.end_lsn))

    limit = cfg.apply.group_commit
    pool = Pool(members, catalog, home.tally, on_commit, past, min(limit, RUN_LIMIT), limit, n)
    log.info("parallel apply: %d sessions", n, extra={"ctx": {"origins": f"{cfg.origin}.1..{n}"}})
    return Leader(cfg, home, pool, catalog, pending, syncs, stopping)


def _member(
    cfg: Config,
    index: int,
    home: Applier,
    spools: SpoolSet,
    rules: SkipRules,
    our_origin_id: int | None,
    turn: CommitTurn,
    report: Callable[[Report], None],
) -> Member:
    target_ci = cfg.target.conninfo()
    catalog = connect(target_ci, f"applier catalog {index}", cfg.apply.target_timeout)
    try:
        session = _member_session(cfg, index)
    except BaseException:
        close_quietly(catalog, "catalog")
        raise
    try:
        applier = Applier(
            cfg,
            session,
            Catalog(catalog),
            spools,
            home.progress,
            1,
            home.no_group_until,
            rules,
            home.careful_until,
            our_origin_id,
        )
    except BaseException:
        session.close()
        close_quietly(catalog, "catalog")
        raise
    return Member(index, member_applier(applier), turn, report, catalog)


def _member_session(cfg: Config, index: int) -> TargetSession:
    name = member(cfg.origin, index)
    try:
        return TargetSession(
            cfg.target.conninfo(),
            name,
            cfg.apply.synchronous_commit,
            cfg.apply.copy_threshold,
            cfg.apply.target_timeout,
            application_name=f"applier apply {index}",
        )
    except ConnectionLost as e:
        if e.context.get("sqlstate") != OBJECT_IN_USE:
            raise
        # This worker holds the plain origin: only its previous process can hold a member.
        raise TransientError(
            f"origin {name!r} is still held by a backend of this worker's previous "
            f"process; waiting for it to end ({e.message})",
            hint="a backend whose client is gone ends when it next reads from it; "
            "applier run retries",
            sqlstate=OBJECT_IN_USE,
        ) from None
