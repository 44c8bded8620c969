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
