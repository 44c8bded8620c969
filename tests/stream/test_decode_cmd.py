"""``applier decode`` end to end through the CLI: JSON and text lines, the slot never moves."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from streamkit import (
    Golden,
    emit_marker,
    golden_fixture,  # noqa: F401 - the `golden` fixture
    slot_position,
)
from workload import BIG

from applier.localpg import LocalCluster
from applier.lsn import Lsn
from applier.stream.replconn import ReplicationConnection

APPLIER = str(Path(sys.executable).with_name("applier"))


def _config(tmp_path: Path, cluster: LocalCluster, db: str, slot: str) -> Path:
    path = tmp_path / "decode.toml"
    path.write_text(
        f"[source]\ndsn = \"{cluster.dsn(db)} options='-c logical_decoding_work_mem=64kB'\"\n"
        f'publications = ["pub"]\nslot = "{slot}"\n'
        f'[target]\ndsn = "{cluster.dsn(db)}"\n'
        '[apply]\nstreaming = "on"\ntwo_phase = true\ntimeout = 10.0\nstatus_interval = 1.0\n'
    )
    return path


def _decode(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [APPLIER, "decode", "--config", str(config), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_decode_json_lines(golden: Golden, tmp_path: Path) -> None:
    cluster, db, wl, end = golden
    slot = f"g_{db}"
    before = slot_position(cluster, db, slot)
    proc = _decode(_config(tmp_path, cluster, db, slot), "--end", str(end), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert slot_position(cluster, db, slot) == before

    assert {"lsn", "type", "xid"} <= set(lines[0])
    kinds = {o["type"] for o in lines}
    assert kinds >= {
        "begin", "commit", "origin", "relation", "type", "insert", "update", "delete",
        "truncate", "message", "stream_start", "stream_stop", "stream_commit", "stream_abort",
        "begin_prepare", "prepare", "commit_prepared", "rollback_prepared",
    }  # fmt: skip
    # The end marker (a non-transactional message at exactly --end) is the last line.
    assert lines[-1]["type"] == "message" and lines[-1]["content"] == "end"
    assert lines[-1]["lsn"] == str(end) and lines[-1]["xid"] is None

    by_xid = _group(lines)
    begin, *_rest = by_xid[wl.xids["def"]]
    assert begin["type"] == "begin" and begin["commit_time"].endswith("Z")
    rows = [o for o in by_xid[wl.xids["def"]] if o["type"] in ("insert", "update", "delete")]
    assert rows[0] == {
        **rows[0],
        "relation": "public.t_def",
        "new": {"id": "1", "v": "one", "big": None},
    }
    assert rows[2]["new"]["big"] == BIG
    assert rows[4]["key"] == {"id": "2"} and "old" not in rows[4]  # only the key columns
    assert rows[5]["new"]["big"] == {"unchanged_toast": True}
    assert rows[6]["type"] == "delete" and rows[6]["key"] == {"id": "1"}

    full = next(o for o in by_xid[wl.xids["full"]] if o["type"] == "update")
    assert full["old"] == {"id": "1", "v": "f"} and full["new"] == {"id": "1", "v": "g"}
    idx = next(o for o in by_xid[wl.xids["idx"]] if o["type"] == "delete")
    assert idx["key"] == {"a": "1", "b": "2"}

    (trunc,) = [o for o in lines if o["type"] == "truncate"]
    assert trunc["cascade"] is True and trunc["restart_identity"] is True
    assert sorted(trunc["relations"]) == ["public.t_child", "public.t_parent"]
    assert trunc["xid"] == wl.xids["truncate"]

    msgs = {o["prefix"]: o for o in lines if o["type"] == "message"}
    assert msgs["tx"]["content"] == "in txn" and msgs["tx"]["content_encoding"] == "text"
    assert msgs["tx"]["xid"] == wl.xids["message"] and msgs["tx"]["transactional"] is True
    assert msgs["nontx"]["content"] == "ff00" and msgs["nontx"]["content_encoding"] == "hex"
    assert msgs["nontx"]["xid"] is None

    streamed = by_xid[wl.xids["stream"]]
    assert {o["type"] for o in streamed} >= {
        "stream_start",
        "insert",
        "stream_abort",
        "stream_commit",
    }
    assert any("subxid" in o for o in streamed if o["type"] == "insert")
    (abort,) = [o for o in streamed if o["type"] == "stream_abort"]
    assert abort["subxid"] != wl.xids["stream"]

    (origin,) = [o for o in lines if o["type"] == "origin"]
    assert origin["origin"] == wl.origin and origin["origin_lsn"] == "0/ABCDEF"
    assert origin["xid"] == wl.xids["origin"]
    prepared = by_xid[wl.xids["2pc_commit"]]
    assert [o["type"] for o in prepared] == [
        "begin_prepare",
        "insert",
        "prepare",
        "commit_prepared",
    ]
    assert prepared[0]["gid"] == prepared[3]["gid"]
    (typ,) = [o for o in lines if o["type"] == "type" and o["name"] == "mood"]
    assert typ["namespace"] == "public" and typ["xid"] == wl.xids["type"]


def _group(lines: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for o in lines:
        if o["xid"] is not None:
            out.setdefault(o["xid"], []).append(o)
    return out


def test_decode_text_format_and_start(golden: Golden, tmp_path: Path) -> None:
    cluster, db, wl, end = golden
    slot = f"g_{db}"
    before = slot_position(cluster, db, slot)
    proc = _decode(_config(tmp_path, cluster, db, slot), "--end", str(end), "--format", "text")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    xid = wl.xids["def"]
    assert any(
        line.endswith(f"xid={xid} INSERT public.t_def id=1 v='one' big=null") for line in lines
    )
    assert any(f"xid={xid} UPDATE public.t_def key: id=2 new: id=20 v='two'" in ln for ln in lines)
    assert any("(unchanged-toast)" in line for line in lines)
    assert slot_position(cluster, db, slot) == before


def test_decode_missing_slot_is_a_clear_error(
    publisher: tuple[LocalCluster, str], tmp_path: Path
) -> None:
    cluster, db = publisher
    proc = _decode(_config(tmp_path, cluster, db, "nosuchslot"), "--end", "0/1")
    assert proc.returncode == 3
    assert "replication slot 'nosuchslot' does not exist" in proc.stderr
    assert "hint: create it" in proc.stderr


def test_decode_never_enables_two_phase_on_the_slot(
    publisher: tuple[LocalCluster, str], tmp_path: Path
) -> None:
    """two_phase = true in the config must not switch two-phase on for the slot (for good)."""
    cluster, db = publisher
    slot = f"n_{db}"
    cluster.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t", db)
    with ReplicationConnection.open(cluster.dsn(db)) as rc:
        rc.create_slot(slot)  # without two-phase
    with psycopg.connect(cluster.dsn(db), autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute(f"PREPARE TRANSACTION 'g_{db}'")
        conn.execute(f"COMMIT PREPARED 'g_{db}'")
    end = emit_marker(cluster, db)
    before = slot_position(cluster, db, slot)

    proc = _decode(_config(tmp_path, cluster, db, slot), "--end", str(end))  # two_phase = true
    assert proc.returncode == 0, proc.stderr
    two_phase = cluster.execute(
        f"SELECT two_phase FROM pg_replication_slots WHERE slot_name = '{slot}'", db
    )
    assert two_phase == [(False,)]
    assert slot_position(cluster, db, slot) == before
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    # The stream as the slot gives it: the prepared transaction decoded at COMMIT PREPARED.
    assert [o["type"] for o in lines if o["type"] != "relation"][:3] == [
        "begin",
        "insert",
        "commit",
    ]
    assert any(o["type"] == "insert" and o["new"] == {"id": "1"} for o in lines)
    cluster.execute(f"SELECT pg_drop_replication_slot('{slot}')", db)


# One source: the wait is decode's own (a progress line every WAIT_SAY_EVERY s, ~10 s
# of the test), the same whatever the server's version.
@pytest.mark.parametrize("publisher", [15], indirect=True)
def test_decode_end_past_the_source_says_what_it_waits_for(
    publisher: tuple[LocalCluster, str], tmp_path: Path
) -> None:
    """Issue 31, item 10: an --end the source has not reached waited silently."""
    cluster, db = publisher
    slot = f"w_{db}"
    cluster.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t", db)
    with ReplicationConnection.open(cluster.dsn(db)) as rc:
        rc.create_slot(slot, two_phase=True)  # as the config asks: no warning about it
        now = rc.identify_system().xlogpos
    end = Lsn(int(now) + 256 * 1024)
    config = _config(tmp_path, cluster, db, slot)
    proc = subprocess.Popen(
        [APPLIER, "decode", "--config", str(config), "--end", str(end), "--format", "text"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stderr], daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        first = lines.get(timeout=30)
        assert f"waiting for the source to reach {end}" in first, first
        assert "it is at" in first and "Ctrl-C" in first
        # The source stays idle: a progress line comes while it waits.
        second = lines.get(timeout=30)
        assert f"still waiting for the source to reach {end}" in second, second
        # Far past the end: a change after it ends the stream (an idle walsender may not
        # report its position for a while).
        cluster.execute("INSERT INTO t SELECT g FROM generate_series(1, 50000) g", db)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait(30)
