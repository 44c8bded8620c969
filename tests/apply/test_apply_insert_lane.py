"""The insert lane (applier.apply.batching.insertlane): INSERTs of transactions that are not
streamed join the session's run straight from their bytes.

Each test would fail if the lane broke: the rows must equal the source's through
every case the lane hands back to the ordinary path (another table, a run that
becomes a COPY by rows or by bytes, NULLs and the bytes COPY escapes), the log
must show that rows took the lane, and an error on a row the lane took must
still name that row's key and its transaction's commit.
"""

from __future__ import annotations

import re

import pytest
from applykit import Runner, wait_equal
from conftest import ONE_PAIR, Pair

from applier.lsn import Lsn

_TABLES = (
    "CREATE TABLE t (id int PRIMARY KEY, v text, n numeric, a int[], j jsonb);"
    "CREATE TABLE s (id int PRIMARY KEY, w text);"
)
_T_ROWS = (
    "INSERT INTO t SELECT g, CASE g % 5 WHEN 0 THEN NULL WHEN 1 THEN E'tab\\there' "
    "WHEN 2 THEN E'back\\\\slash\\nnew line\\r' WHEN 3 THEN '' ELSE repeat('x', g % 300) END, "
    "CASE WHEN g % 7 = 0 THEN NULL ELSE g / 3.0 END, ARRAY[g, NULL, -g], "
    "jsonb_build_object('k', E'q\"\\\\\\t', 'g', g) FROM generate_series({lo}, {hi}) g;"
)


def _lane_rows(runner: Runner) -> int:
    m = re.findall(r"applier run stopped.*lane_rows=(\d+)", runner.log())
    assert m, runner.log()[-2000:]
    return int(m[-1])


@ONE_PAIR
@pytest.mark.parametrize("threshold", [64, 4096])
def test_insert_lane_rows_equal(pair: Pair, threshold: int) -> None:
    """64: runs become COPYs part way and the lane goes on with COPY lines; 4096:
    the rows are held and sent as multi-row INSERTs, but for the wide rows, which
    pass MAX_HELD_BYTES and make the run a COPY by its bytes."""
    pair.both(_TABLES)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"copy_threshold": threshold})
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec(
        "BEGIN;"
        + _T_ROWS.format(lo=1, hi=3000)
        + "INSERT INTO s SELECT g, E'\\\\N' FROM generate_series(1, 500) g;"
        + _T_ROWS.format(lo=3001, hi=3500)
        + "INSERT INTO t VALUES (3501, 'one'); INSERT INTO s VALUES (501, 'one');"
        + "INSERT INTO t SELECT g, repeat(md5(g::text), 30000), NULL, NULL, NULL "
        "FROM generate_series(3502, 3515) g;"
        "COMMIT;"
    )
    for k in range(20):  # small transactions, committed as groups
        lo = 4000 + 20 * k
        pair.pub_exec(_T_ROWS.format(lo=lo, hi=lo + 19))
    wait_equal(pair, ["t", "s"], runner=runner, timeout=90)
    assert runner.stop() == 0
    assert _lane_rows(runner) > 3000


@ONE_PAIR
def test_error_on_a_lane_row_names_it(pair: Pair) -> None:
    pair.both(_TABLES)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.sub_exec("INSERT INTO t (id, v) VALUES (2000, 'only on the target')")
    runner = Runner(pair, pair.write_config()).start().ready()
    with pair.pub_conn(autocommit=True) as conn:
        start = Lsn.parse(str(conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]))
        conn.execute("BEGIN")
        conn.execute(_T_ROWS.format(lo=1, hi=3000))
        end = Lsn.parse(str(conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]))
        conn.execute("COMMIT")
    assert runner.wait(90) == 3
    line = [ln for ln in runner.log().splitlines() if " applier: error: " in ln][-1]
    assert "23505" in line and "public.t" in line and "'id': '2000'" in line, line
    m = re.search(r"\blsn=([0-9A-F]+/[0-9A-F]+)", line)
    assert m, line
    assert start < Lsn.parse(m.group(1)) < end  # the row's own position
    assert pair.sub_exec("SELECT count(*) FROM t") == [(1,)]  # nothing of it committed
