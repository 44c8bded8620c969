"""Progress with N apply sessions: an origin per session before PostgreSQL 19, one shared on 19+.

Why one origin is not enough before 19
======================================

A replication origin can be set up by one backend at a time
(``pg_replication_origin_session_setup`` fails with 55006 for a second one),
and a commit advances the origin of the session that makes it. PostgreSQL 19
lets several backends share one (``pg_replication_origin_session_setup(name,
pid)``, naming the backend that first set it up), "to allow parallelization of
SQL-level replication solutions". Before 19 each session holds an origin of
its own: the *group* ``<origin>.1 .. <origin>.N``.

The restart point is the largest progress in the group
=======================================================

Claim: with the schedule's ordered commits (:mod:`.schedule`: a transaction's
COMMIT is sent only after its predecessor's COMMIT has *returned*), the
largest progress among the group's origins (and the plain ``<origin>``, from
runs with one session) is the end LSN of the last transaction committed, and
every transaction before it has committed. Restarting the stream there
applies each transaction exactly once.

1. Each origin's progress is the end LSN of a transaction that committed. The
   stamp is made inside COMMIT (:mod:`applier.apply.target.stamp`): a session
   lost before its COMMIT reached the server leaves its origin alone, and so
   does a backend terminated inside COMMIT (nothing between the stamp and the
   commit record checks for interrupts). A COMMIT that fails after the stamp is
   rewound by its session while it lives, as with one session today.
2. The committed transactions are a prefix T_1 .. T_m of the source's commit
   order: T_k+1's COMMIT is sent after T_k's returned. That holds after a crash
   of the target too: T_k's commit record is in the WAL before T_k+1's (it was
   inserted before T_k's COMMIT returned), recovery replays a prefix of the WAL,
   and origin progress is recovered from the replayed commit records.
3. So the session that committed T_m holds E_m (end LSNs grow with commit
   order), every other origin holds the end of some T_j, j < m, so E_j < E_m: the
   maximum is E_m, and the walsender resends exactly T_m+1, T_m+2, ...

*A session that dies between its own commit and its successor's.* Say A sends
T_k's COMMIT and dies (its backend terminated, its connection lost) before the
leader let B commit T_k+1. Either T_k committed (A's origin holds E_k, the
maximum) or it did not (A's origin holds an earlier T_j's end, and the maximum
is E_k-1, held by whoever committed T_k-1): the leader cannot tell from the lost
connection and does not need to. It lets no later transaction commit (B's turn
comes only with A's result), stops every session at a transaction boundary
(their open transactions roll back, their origins untouched), and restarts
from the maximum: T_k is resent if and only if it did not commit. If A dies
after its COMMIT returned, B may commit T_k+1 or not; the maximum is E_k+1 or
E_k accordingly. No transaction is skipped, none applied twice.

*The leader's own session* (the plain ``<origin>``) commits barriers and, in the
inline lane (:mod:`.lanes`), groups of ordinary transactions without waiting for
each result. It is one more session in the same order: it starts only once the
pool has drained (every earlier COMMIT returned), and no member commits after
it before its own COMMITs have returned (``Leader._home_alone`` takes their
results first). So 2 holds across lanes, and a crash between a group's COMMIT
and a member's leaves the same prefix.

A group of another size (``workers`` changed between runs) reads the same way:
an origin left from a larger group holds the end of a committed transaction
too.

*Members cannot be another worker's origin.* The config allows origin names of
``[a-z0-9_]`` and defaults to the slot's name, so workers ``a`` and ``a_2`` (or
``pg`` beside a built-in subscription's ``pg_16384``) are legal; a member named
``a_2`` would take another stream's position for ours. Members are named
``<origin>.<n>``: a ``.`` no configured origin (nor a built-in one) contains.

On PostgreSQL 19+ the sessions share ``<origin>``; every commit advances it,
and ordered commits make it monotone: the restart point is read as today.
PostgreSQL 19 is not available on this machine: that path is written from its
documentation and is not tested here (the group is, on 15 and 18).
"""

from __future__ import annotations

from typing import Any

import psycopg

from applier.apply.target.origin import ensure_origin
from applier.errors import ConfigError, PermanentError
from applier.lsn import Lsn
from applier.origingroup import SEPARATOR, member, members_sql, progress_sql

__all__ = [
    "SEPARATOR", "SHARED_SINCE", "check_capacity", "create_group", "drop_group",
    "group_progress", "member", "restart_point", "setup_session", "shares_origin", "trim_group",
]  # fmt: skip

#: The first server version whose sessions can share an origin.
SHARED_SINCE = 190000

# Members of the group: '<origin>.' then digits (applier.origingroup's one rule).
_MEMBERS = (
    "SELECT roname, pg_catalog.pg_replication_origin_progress(roname, true)::text "
    "FROM pg_catalog.pg_replication_origin WHERE " + members_sql() + " ORDER BY roname"
)


def shares_origin(server_version_num: int) -> bool:
    """Whether the target's sessions share one origin (19+) rather than a group."""
    return server_version_num >= SHARED_SINCE


def create_group(conn: psycopg.Connection[Any], origin: str, sessions: int) -> list[str]:
    """Create the origins of sessions 1..``sessions`` that do not exist; their names."""
    names = [member(origin, i) for i in range(1, sessions + 1)]
    return [name for name in names if ensure_origin(conn, name)]


#: The setting that bounds the origins with progress (each holds a slot of the
#: server's replication state, whether a session holds it or not).
_CAPACITY = """
SELECT pg_catalog.current_setting(CASE WHEN pg_catalog.current_setting('server_version_num')::int
                                          >= 180000
                                       THEN 'max_active_replication_origins'
                                       ELSE 'max_replication_slots' END)::int,
       CASE WHEN pg_catalog.current_setting('server_version_num')::int >= 180000
            THEN 'max_active_replication_origins' ELSE 'max_replication_slots' END,
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_replication_origin_status)::int
"""


_WITH_STATE = """
SELECT pg_catalog.count(*) FROM pg_catalog.pg_replication_origin_status s
  JOIN pg_catalog.pg_replication_origin o ON o.roident = s.local_id
 WHERE o.roname = ANY(%s)
"""


def check_capacity(conn: psycopg.Connection[Any], origin: str, sessions: int) -> None:
    """Refuse (exit 2) before anything is created when the target cannot hold one
    more origin state for each member that has none yet."""
    cap, setting, used = conn.execute(_CAPACITY).fetchone() or (0, "", 0)
    names = [member(origin, i) for i in range(1, sessions + 1)]
    row = conn.execute(_WITH_STATE, (names,)).fetchone()
    needed = len(names) - (int(row[0]) if row else 0)
    if used + needed > cap:
        raise ConfigError(
            f"[apply] workers = {sessions} needs {needed} more replication origin states on "
            f"the target (one per session), and it has {used} of {setting} = {cap} in use",
            hint=f"raise {setting} on the target to at least {used + needed} (a restart of "
            "the target is needed), or lower [apply] workers; `applier drop` of another "
            "stream frees its origins",
        )


def trim_group(conn: psycopg.Connection[Any], origin: str, sessions: int) -> list[str]:
    """Drop members beyond ``sessions`` (left by a run with more) whose progress is
    below the restart point: another origin holds that, so nothing is lost, and
    each frees a slot of the server's replication state. Their names."""
    top = restart_point(conn, origin)
    gone = []
    for name, lsn in group_progress(conn, origin).items():
        index = int(name.rsplit(SEPARATOR, 1)[1])
        if index > sessions and lsn < top:
            try:
                conn.execute("SELECT pg_catalog.pg_replication_origin_drop(%s)", (name,))
            except psycopg.errors.ObjectInUse:
                continue  # a backend of a process gone still holds it: next time
            gone.append(name)
    return gone


def group_progress(conn: psycopg.Connection[Any], origin: str) -> dict[str, Lsn]:
    """Every origin of ``origin``'s group (whatever size it had) and its durable progress."""
    rows = conn.execute(_MEMBERS, (origin,)).fetchall()
    return {str(r[0]): Lsn(0) if r[1] is None else Lsn.parse(str(r[1])) for r in rows}


def restart_point(conn: psycopg.Connection[Any], origin: str) -> Lsn:
    """Where the stream restarts: the largest progress of ``origin`` and its group
    (``Lsn(0)`` when none of them exists or has progress)."""
    row = conn.execute(f"SELECT {progress_sql()}::text", (origin,)).fetchone()
    return Lsn(0) if row is None or row[0] is None else Lsn.parse(str(row[0]))


def drop_group(conn: psycopg.Connection[Any], origin: str) -> list[str]:
    """Drop the group's origins (not ``origin`` itself); their names. A member set up
    by a live session cannot be dropped: PostgreSQL says so (55006)."""
    names = list(group_progress(conn, origin))
    for name in names:
        conn.execute("SELECT pg_catalog.pg_replication_origin_drop(%s)", (name,))
    return names


def setup_session(
    conn: psycopg.Connection[Any], origin: str, index: int, first_pid: int | None = None
) -> str:
    """Set up session ``index``'s origin on its target connection; the origin's name.

    Before 19: its own member of the group (created before, :func:`create_group`).
    On 19+: the shared ``origin``, session 1 first, the others naming the backend
    pid of session 1 (``first_pid``).
    """
    if not shares_origin(conn.info.server_version):
        name = member(origin, index)
        conn.execute("SELECT pg_catalog.pg_replication_origin_session_setup(%s)", (name,))
        return name
    if index == 1:
        conn.execute("SELECT pg_catalog.pg_replication_origin_session_setup(%s)", (origin,))
        return origin
    if first_pid is None:
        raise PermanentError(
            f"session {index} cannot share origin {origin}: the first session's pid is unknown",
            hint="set up session 1 first and pass its backend pid",
        )
    conn.execute(
        "SELECT pg_catalog.pg_replication_origin_session_setup(%s, %s)", (origin, first_pid)
    )
    return origin
