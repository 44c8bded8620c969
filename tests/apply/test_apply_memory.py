"""Memory stays bounded by the changes in flight, not by the transaction's size."""

from __future__ import annotations

from pathlib import Path

import pytest
from applykit import Runner, wait_equal, wait_for
from conftest import Pair


def _rss_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_merged_deletes_in_flight_are_bounded(pair: Pair) -> None:
    """300,000 DELETEs merged 256 to a statement: the pipeline holds their changes until
    the results come, and counting statements instead of rows let a transaction's
    whole delete pile up in memory (1,000,000 rows: 456 MB of RSS)."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.both("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 300000) g")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    assert runner.proc is not None
    pid = runner.proc.pid
    wait_for(lambda: _rss_mb(pid, "VmRSS") > 0, 10, "the worker's memory")
    before = _rss_mb(pid, "VmHWM")
    pair.pub_exec("DELETE FROM t")
    pair.pub_exec("INSERT INTO t VALUES (0, 'after')")
    wait_equal(pair, ["t"], runner=runner, timeout=120)
    grew = _rss_mb(pid, "VmHWM") - before
    assert runner.stop() == 0
    assert grew < 60, f"peak RSS grew by {grew:.0f} MB for 300,000 deletes"


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
@pytest.mark.parametrize("kind", ["copied", "checked", "merged", "full"])
def test_wide_rows_in_memory_are_bounded_in_bytes(pair: Pair, kind: str) -> None:
    """One transaction of 250 rows of 1 MB: every place that holds rows is bounded
    in bytes, not only in count. Each was found holding the whole transaction:
    the stream's batch (10,000 messages), the rows held for a run's decision
    (copy_threshold: 1000; checked INSERTs: 256), the merged UPDATEs (256 keys;
    FULL identity: 256 changes) and the changes awaiting their results in the
    pipeline (20,000). The stream read ahead while the pipeline waits holds
    8 MB more at most (READ_AHEAD_BYTES; measured: +6 to +20 MB of peak RSS
    here, with libpq's buffer), hence 90 MB, not 80."""
    pk = "" if kind == "full" else " PRIMARY KEY"  # FULL: held when the target has no key
    pair.both(f"CREATE TABLE w (id int{pk}, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    if kind in ("merged", "full"):
        pair.both("INSERT INTO w SELECT g, 'x' FROM generate_series(1, 250) g")
    if kind == "full":
        pair.both("ALTER TABLE w REPLICA IDENTITY FULL")
    conflicts = {"default": {"insert_exists": "skip"}} if kind == "checked" else {}
    cfg = pair.write_config(apply={"streaming": "off"}, conflicts=conflicts)
    runner = Runner(pair, cfg).start().ready()
    assert runner.proc is not None
    pid = runner.proc.pid
    wait_for(lambda: _rss_mb(pid, "VmRSS") > 0, 10, "the worker's memory")
    before = _rss_mb(pid, "VmHWM")
    wide = "repeat(md5(g::text), 31250)"
    if kind in ("merged", "full"):
        pair.pub_exec(f"UPDATE w SET v = {wide.replace('g::text', 'id::text')}")
    else:
        pair.pub_exec(f"INSERT INTO w SELECT g, {wide} FROM generate_series(1, 250) g")
    wait_equal(pair, ["w"], runner=runner, timeout=120)
    grew = _rss_mb(pid, "VmHWM") - before
    assert runner.stop() == 0
    assert grew < 90, f"peak RSS grew by {grew:.0f} MB for 250 rows of 1 MB"
