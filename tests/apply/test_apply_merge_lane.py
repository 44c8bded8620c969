"""The merge lane (applier.apply.batching.mergelane): streamed UPDATEs and DELETEs held in the
merger straight from their bytes, live or replayed from the spool.

Each test would fail if the lane broke: the rows must equal the source's through
every case the lane hands back to the ordinary path, the log must show rows took
the lane, and a missing row must be recorded with its own key and LSN although the
lane never decoded its message.
"""

from __future__ import annotations

import json
import re

import pytest
from applykit import Runner, wait_equal, wait_for
from conftest import ONE_PAIR, Pair

from applier.lsn import Lsn

_TABLES = (
    "CREATE TABLE t (id int PRIMARY KEY, v text, n int, big text);"
    "CREATE TABLE k2 (a int, b text, w text, PRIMARY KEY (a, b));"
)
# Out-of-line TOAST values (md5 text compresses poorly): an UPDATE that does not set
# `big` sends it as unchanged ('u').
_ROWS = (
    "INSERT INTO t SELECT g, 'v' || g, g, CASE WHEN g % 100 = 0 THEN "
    "(SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 200) i) END "
    "FROM generate_series(1, 6000) g;"
    "INSERT INTO k2 SELECT g, 'b' || (g % 3), 'w' FROM generate_series(1, 3000) g;"
)


def _start(pair: Pair, streaming: str) -> Runner:
    pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")
    pair.both(_TABLES + _ROWS)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"streaming": streaming})
    return Runner(pair, cfg).start().ready()


def _lane_rows(runner: Runner) -> int:
    return max([int(m) for m in re.findall(r"lane_rows=(\d+)", runner.log())] or [0])


@ONE_PAIR
@pytest.mark.parametrize("streaming", ["parallel", "on"])
def test_merge_lane_rows_equal(pair: Pair, streaming: str) -> None:
    """NULLs and escapes, one key updated many times, unchanged TOAST merged with an
    earlier value, a second table with a two-column key between runs, a key change
    (old key sent), a key deleted, inserted and deleted again, DELETEs of rows updated
    before in the same transaction."""
    runner = _start(pair, streaming)
    pair.pub_exec(
        r"""
        BEGIN;
        UPDATE t SET v = CASE id % 4 WHEN 0 THEN NULL WHEN 1 THEN E'tab\tback\\slash\n'
            ELSE 'x' || id END WHERE id <= 5000;
        UPDATE t SET n = n + 1 WHERE id % 100 = 0;
        UPDATE t SET big = (SELECT string_agg(md5(i::text || id::text), '')
            FROM generate_series(1, 200) i) WHERE id % 200 = 0;
        UPDATE t SET n = n * 2 WHERE id % 100 = 0;
        UPDATE k2 SET w = 'k' || a WHERE a <= 2500;
        UPDATE t SET n = -n WHERE id BETWEEN 10 AND 20;
        UPDATE t SET n = -n WHERE id BETWEEN 10 AND 20;
        UPDATE t SET id = id + 100000 WHERE id BETWEEN 5001 AND 5100;
        UPDATE t SET v = 'after key change' WHERE id BETWEEN 100000 AND 110000;
        DELETE FROM t WHERE id % 7 = 0;
        INSERT INTO t VALUES (7, 'again', 0, NULL), (14, 'again', 0, NULL);
        DELETE FROM t WHERE id IN (7, 14);
        DELETE FROM k2 WHERE a % 5 = 0;
        DELETE FROM t WHERE id BETWEEN 5500 AND 5600;
        COMMIT;
        """
    )
    wait_equal(pair, ["t", "k2"], runner=runner, timeout=90)
    assert runner.stop() == 0
    assert _lane_rows(runner) > 8000, runner.log()[-2000:]


@ONE_PAIR
def test_missing_rows_through_the_lane_are_recorded_with_their_keys(pair: Pair) -> None:
    runner = _start(pair, "parallel")
    pair.sub_exec("DELETE FROM t WHERE id IN (3000, 4000, 4500)")
    with pair.pub_conn(autocommit=True) as conn:
        conn.execute("BEGIN")
        xid = conn.execute("SELECT txid_current()").fetchone()[0]
        conn.execute("UPDATE t SET v = 'u' WHERE id <= 4000")
        conn.execute("DELETE FROM t WHERE id > 4400")
        lsn = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        conn.execute("COMMIT")
    wait_for(
        lambda: (
            pair.sub_exec("SELECT count(*) FROM t WHERE v = 'u'") == [(3998,)]
            and pair.sub_exec("SELECT count(*) FROM t WHERE id > 4400") == [(0,)]
        ),
        60,
        "the transaction applied",
    )
    wait_for(lambda: len(pair.sub_exec("SELECT 1 FROM applier.conflict_log")) >= 3, 30, "3 records")
    assert runner.stop() == 0
    records = pair.sub_exec(
        "SELECT conflict, key::text, xid, commit_lsn FROM applier.conflict_log ORDER BY id"
    )
    got = sorted((r[0], json.loads(r[1])["id"]) for r in records)
    assert got == [
        ("delete_missing", "4500"),
        ("update_missing", "3000"),
        ("update_missing", "4000"),
    ], records
    # The commit record is the next one after the changes.
    after = Lsn.parse(str(lsn))
    assert {(r[2], Lsn.parse(str(r[3])) >= after) for r in records} == {(xid, True)}, records
    assert _lane_rows(runner) > 1000, runner.log()[-2000:]
