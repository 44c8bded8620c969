"""What each source PostgreSQL version can do, in one place (pure: no I/O).

Logical replication with pgoutput exists from PostgreSQL 10. What came later,
and what applier does on a source without it (README, "Supported versions"):

==================  =====  ==================================================
feature             since  on an older source
==================  =====  ==================================================
pgoutput proto 2    14     (streaming of in-progress transactions)
``binary``          14     a warning; values come as text (always correct)
``messages``        14     not asked for (applier only reads them)
``streaming``       14     a warning; large transactions come at commit
proto 3, two_phase  15     a warning; prepared transactions come at COMMIT
                           PREPARED as ordinary ones
slot option syntax  15     ``CREATE_REPLICATION_SLOT s LOGICAL pgoutput
                           EXPORT_SNAPSHOT`` / ``NOEXPORT_SNAPSHOT`` instead
                           of ``(SNAPSHOT 'export')``
proto 4, parallel   16     ``streaming = "parallel"`` asks for "on" (applied live anyway)
``origin`` option   16     ``origin = "none"`` is filtered by applier
failover slots      17     ``[source] failover = true`` is refused (exit 2)
==================  =====  ==================================================

Catalog columns the source-side SQL reads, by version: ``pg_replication_slots``
``wal_status`` (13), ``two_phase`` (14), ``failover`` (17);
``pg_attribute.attgenerated`` (12); ``pg_publication_tables.attnames`` and
``rowfilter`` (15); ``pg_partition_tree()`` (12).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from applier.errors import ConfigError

log = logging.getLogger("applier.stream")

#: The oldest source with pgoutput.
MIN_SOURCE = 10
#: The oldest target applier runs on: the oldest release tested on real servers
#: (README, "Supported PostgreSQL versions"; 14 is the oldest build that installs
#: here). Nothing older is known to fail; it is refused because it is untested.
MIN_TARGET = 14

Snapshot = Literal["export", "nothing", "use"]
_OLD_SNAPSHOT = {"export": "EXPORT_SNAPSHOT", "nothing": "NOEXPORT_SNAPSHOT", "use": "USE_SNAPSHOT"}


def major(server_version: int) -> int:
    """170004 -> 17 (libpq's server_version; majors before 10 had two parts)."""
    return server_version // 10000


@dataclass(frozen=True)
class Features:
    """What a source of one major version supports."""

    major: int
    proto_version: int  # the highest pgoutput protocol version
    binary: bool
    messages: bool
    streaming: bool
    two_phase: bool
    parallel_streaming: bool
    origin_option: bool
    slot_options_syntax: bool  # CREATE_REPLICATION_SLOT ... ( option, ... )
    failover: bool
    slot_wal_status: bool
    slot_two_phase: bool
    generated_columns: bool
    publication_filters: bool  # pg_publication_tables.attnames / rowfilter


def features(server_version: int) -> Features:
    m = major(server_version)
    return Features(
        major=m,
        proto_version=max_proto_version(server_version),
        binary=m >= 14,
        messages=m >= 14,
        streaming=m >= 14,
        two_phase=m >= 15,
        parallel_streaming=m >= 16,
        origin_option=m >= 16,
        slot_options_syntax=m >= 15,
        failover=m >= 17,
        slot_wal_status=m >= 13,
        slot_two_phase=m >= 14,
        generated_columns=m >= 12,
        publication_filters=m >= 15,
    )


def max_proto_version(server_version: int) -> int:
    """The highest pgoutput proto_version a server speaks: 1 (<14), 2 (14), 3 (15), 4 (16+)."""
    m = major(server_version)
    if m >= 16:
        return 4
    if m >= 15:
        return 3
    if m >= 14:
        return 2
    return 1


def check_source(server_version: int, *, failover: bool, binary: bool = False) -> None:
    """Refuse (exit 2) what the source cannot do and a restart will not change; warn
    where applier does without. Called before anything is created on the source."""
    f = features(server_version)
    if f.major < MIN_SOURCE:
        raise ConfigError(
            f"the source runs PostgreSQL {server_version}: logical replication with "
            f"pgoutput needs {MIN_SOURCE} or later",
            hint="upgrade the source, or copy it another way (pg_dump)",
        )
    if failover and not f.failover:
        raise ConfigError(
            f"source.failover = true needs PostgreSQL 17 or later on the source "
            f"(it runs {f.major}): slots are synchronised to standbys from 17",
            hint="set source.failover = false (the slot then stays on the primary only)",
        )
    if binary and not f.binary:
        log.warning(
            "apply.binary needs a PostgreSQL 14+ source (it runs %d): values come as text",
            f.major,
        )


def check_target(server_version: int) -> None:
    """Refuse (exit 2) a target older than :data:`MIN_TARGET`, before anything is written."""
    if major(server_version) < MIN_TARGET:
        raise ConfigError(
            f"the target runs PostgreSQL {server_version}: applier supports targets "
            f"{MIN_TARGET} and later",
            hint=f"point [target] dsn at a PostgreSQL {MIN_TARGET} or later server",
        )


def create_slot_sql(
    quoted_name: str,
    server_version: int,
    *,
    snapshot: Snapshot = "nothing",
    temporary: bool = False,
    two_phase: bool = False,
    failover: bool = False,
) -> str:
    """CREATE_REPLICATION_SLOT for a pgoutput slot, in the syntax the server speaks.

    ``two_phase`` is dropped before 15 (pgoutput decodes prepared transactions
    from protocol 3 only); ``failover`` before 17 is an error (see
    :func:`check_source`, which callers run first).
    """
    f = features(server_version)
    temp = " TEMPORARY" if temporary else ""
    head = f"CREATE_REPLICATION_SLOT {quoted_name}{temp} LOGICAL pgoutput"
    if failover and not f.failover:
        raise ConfigError(f"failover slots need PostgreSQL 17 or later (the source runs {f.major})")
    if not f.slot_options_syntax:
        return f"{head} {_OLD_SNAPSHOT[snapshot]}"
    opts = [f"SNAPSHOT '{snapshot}'"]
    if two_phase:
        opts.append("TWO_PHASE true")
    if failover:
        opts.append("FAILOVER true")
    return f"{head} ({', '.join(opts)})"


def slot_state_sql(server_version: int, literal_name: str) -> str:
    """The ``pg_replication_slots`` row :class:`~applier.stream.replconn.SlotState` reads;
    columns a version lacks read as false."""
    f = features(server_version)
    two_phase = "two_phase" if f.slot_two_phase else "false"
    failover = "failover" if f.failover else "false"
    return (
        f"SELECT slot_name, slot_type, plugin, database, {two_phase}, "  # noqa: S608
        f"confirmed_flush_lsn::text, active, {failover} FROM pg_catalog.pg_replication_slots "
        f"WHERE slot_name = {literal_name}"
    )


def alter_failover_sql(quoted_name: str, failover: bool) -> str:
    """ALTER_REPLICATION_SLOT (PostgreSQL 17+)."""
    return f"ALTER_REPLICATION_SLOT {quoted_name} (FAILOVER {'true' if failover else 'false'})"
