"""Helpers for the stream tests: open a stream, read up to a marker, the ``golden`` fixture.

The fixture lives here, not in a tests/stream/conftest.py, because a second
``conftest`` module would shadow tests/conftest.py for ``from conftest import Pair``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from workload import SCHEMA, Workload, drop_origin, run_workload

from applier.localpg import LocalCluster
from applier.lsn import Lsn
from applier.protocol import Message, PgOutputMessage
from applier.stream import LogicalStream, ReplicationConnection, StreamOptions

Item = tuple[Lsn, PgOutputMessage]
#: What the ``golden`` fixture yields: cluster, database, workload, end marker LSN.
Golden = tuple[LocalCluster, str, Workload, Lsn]

#: Startup options for the walsender: spill/stream transactions beyond 64kB.
SMALL_WORK_MEM = "-c logical_decoding_work_mem=64kB"


def repl_dsn(cluster: LocalCluster, db: str, options: str | None = None) -> str:
    dsn = cluster.dsn(db)
    return f"{dsn} options='{options}'" if options else dsn


def open_stream(
    cluster: LocalCluster, db: str, slot: str, *, options: str | None = None, **kw: Any
) -> LogicalStream:
    conn = ReplicationConnection.open(repl_dsn(cluster, db, options))
    kw.setdefault("publications", ["pub"])
    kw.setdefault("timeout", 10.0)
    kw.setdefault("status_interval", 1.0)
    stream = LogicalStream(conn, StreamOptions(slot=slot, **kw))
    stream.start()
    return stream


def emit_marker(cluster: LocalCluster, db: str, name: str = "end") -> Lsn:
    """A non-transactional logical message; returns its LSN (the stream's end marker)."""
    row = cluster.execute(f"SELECT pg_logical_emit_message(false, 'marker', '{name}')::text", db)
    return Lsn.parse(row[0][0])


def read_until_marker(stream: LogicalStream, name: str = "end", limit: float = 30.0) -> list[Item]:
    """Read until the marker message; return everything before it."""
    out: list[Item] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for lsn, msg in stream.read(0.5):
            if isinstance(msg, Message) and msg.prefix == "marker" and msg.content == name.encode():
                return out
            out.append((lsn, msg))
    raise AssertionError(f"marker {name!r} not seen in {limit}s; got {len(out)} messages")


def slot_position(cluster: LocalCluster, db: str, slot: str) -> Lsn:
    row = cluster.execute(
        f"SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{slot}'", db
    )
    return Lsn.parse(row[0][0])


@pytest.fixture(name="golden")
def golden_fixture(publisher: tuple[LocalCluster, str]) -> Iterator[Golden]:
    """The golden workload on a fresh database, slot ``g_<db>`` (two-phase) created before it."""
    cluster, db = publisher
    cluster.execute(SCHEMA, db)
    with ReplicationConnection.open(cluster.dsn(db)) as rc:
        rc.create_slot(f"g_{db}", two_phase=True)
    wl = run_workload(cluster, db)
    end = emit_marker(cluster, db)
    try:
        yield cluster, db, wl, end
    finally:
        drop_origin(cluster, wl)
