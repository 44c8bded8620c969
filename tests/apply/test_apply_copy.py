"""Runs of INSERTs go out as COPY: values equal, order kept, errors name the row."""

from __future__ import annotations

import pytest
from applykit import Runner, origin_lsn, wait_equal, wait_for
from conftest import ONE_PAIR, Pair

from applier.apply.sql.copyrun import text_row

# Every byte COPY's text format treats specially, NULLs, and text that looks
# like COPY syntax ('\N', '\.').
TRICKY_DDL = """
CREATE TABLE c (id int PRIMARY KEY, s text, arr text[], j jsonb, b bytea, n numeric,
                ts timestamptz);
CREATE TABLE other (id int PRIMARY KEY, v text);
"""

TRICKY_ROWS = """
SET TIME ZONE 'Pacific/Chatham';
INSERT INTO c SELECT g,
    CASE g % 7 WHEN 0 THEN E'tab\\there' WHEN 1 THEN E'new\\nline\\r\\n'
               WHEN 2 THEN E'back\\\\slash' WHEN 3 THEN '\\N'
               WHEN 4 THEN '' WHEN 5 THEN NULL ELSE E'\\\\.' END,
    ARRAY[E'a\\tb', NULL, 'c"d', E'e\\\\f', ''],
    jsonb_build_object('k', E'v\\n\\t\\\\', 'n', g),
    decode(lpad(to_hex(g), 8, '0'), 'hex') || E'\\\\x09'::bytea,
    g / 7.0,
    '2024-01-01 00:00+00'::timestamptz + g * interval '1 minute'
FROM generate_series(1, 300) g;
"""


@pytest.mark.parametrize("threshold", [0, 1, 64])
@ONE_PAIR
def test_insert_runs_text_values_equal(pair: Pair, threshold: int) -> None:
    pair.both(TRICKY_DDL)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"copy_threshold": threshold})
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec(
        TRICKY_ROWS + "UPDATE c SET s = 'u' WHERE id % 50 = 0; DELETE FROM c WHERE id % 60 = 1;"
        # Short runs (alternating tables) between long ones, in one transaction.
        "INSERT INTO other VALUES (1, 'a'); INSERT INTO c (id) VALUES (1001);"
        "INSERT INTO other VALUES (2, E'\\\\N'); INSERT INTO c (id, s) VALUES (1002, E'x\\ty');"
        "INSERT INTO c (id, s) SELECT g, 'late' FROM generate_series(2000, 2100) g;"
        "UPDATE c SET s = 'after copy' WHERE id = 2050;"
        "INSERT INTO other SELECT g, repeat('z', g) FROM generate_series(3, 200) g"
    )
    wait_equal(pair, ["c", "other"], runner=runner)
    for q in ("SELECT c::text FROM c ORDER BY id", "SELECT other::text FROM other ORDER BY id"):
        assert pair.pub_exec(q) == pair.sub_exec(q)
    assert runner.stop() == 0


@ONE_PAIR
def test_insert_runs_binary_values_equal(pair: Pair) -> None:
    pair.both(
        "CREATE TABLE bn (id int PRIMARY KEY, s text, a int[], n numeric, f float8, "
        "ts timestamptz, b bytea, u uuid, j jsonb, iv interval)"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"binary": True, "copy_threshold": 8})
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec(
        "INSERT INTO bn SELECT g, CASE WHEN g % 5 = 0 THEN NULL ELSE E'x\\ty' || g END, "
        "ARRAY[g, NULL], g / 3.0, CASE WHEN g % 9 = 0 THEN 'NaN' ELSE g * 1.5e-10 END, "
        "'2000-01-01'::timestamptz + g * interval '1 day', '\\x00ff'::bytea, "
        "gen_random_uuid(), jsonb_build_object('g', g), g * interval '1 hour' "
        "FROM generate_series(1, 200) g"
    )
    wait_equal(pair, ["bn"], runner=runner)
    q = "SELECT bn::text FROM bn ORDER BY id"
    assert pair.pub_exec(q) == pair.sub_exec(q)
    assert runner.stop() == 0


def test_copy_error_names_the_failing_row(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.sub_exec("INSERT INTO t VALUES (300, 'diverged')")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"copy_threshold": 10})
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1, 'first')")
    wait_for(lambda: pair.sub_exec("SELECT count(*) FROM t")[0][0] == 2, 30, "the first txn")
    before = origin_lsn(pair, pair.slot)
    with pair.pub_conn() as conn, conn.transaction():
        conn.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(2, 500) g")
        xid = conn.execute("SELECT txid_current()").fetchone()
    assert runner.wait(60) == 3  # an apply error: a restart will not fix it
    line = [ln for ln in runner.log().splitlines() if " applier: error: " in ln][-1]
    assert "23505" in line and "public.t" in line and "(id)=(300)" in line, line
    # id 300 is the 299th row of the transaction: line 299 of the COPY.
    assert "copy_line=299" in line and f"xid={xid and xid[0]}" in line, line
    assert origin_lsn(pair, pair.slot) == before
    assert pair.sub_exec("SELECT count(*) FROM t") == [(2,)]
    # The user resolves the conflict; the transaction is applied whole.
    pair.sub_exec("DELETE FROM t WHERE id = 300")
    runner = Runner(pair, cfg, "applier2.log").start().ready()
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_wide_rows_start_the_copy_before_the_row_count(pair: Pair) -> None:
    """Rows held for a run's decision are capped in bytes too, not only in count:
    a run of wide rows becomes a COPY (its error names a COPY line) long before
    ``copy_threshold`` rows, instead of holding them all in memory."""
    pair.both("CREATE TABLE w (id int PRIMARY KEY, v text)")
    pair.sub_exec("INSERT INTO w VALUES (30, 'diverged')")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"copy_threshold": 100000, "streaming": "off"})
    runner = Runner(pair, cfg).start().ready()
    # 40 rows of 1 MB: past MAX_HELD_BYTES when the first 16 are weighed, far below
    # the threshold.
    pair.pub_exec(
        "INSERT INTO w SELECT g, repeat(chr(64 + g), 1000000) FROM generate_series(1, 40) g"
    )
    assert runner.wait(60) == 3
    line = [ln for ln in runner.log().splitlines() if " applier: error: " in ln][-1]
    assert "23505" in line and "(id)=(30)" in line and "copy_line=30" in line, line
    assert pair.sub_exec("SELECT count(*) FROM w") == [(1,)]


def test_text_row_round_trips_through_copy(pair: Pair) -> None:
    """The encoder against the server's own COPY parser, for every byte 1..127."""
    pair.sub_exec("CREATE TABLE r (a text, b text, c text)")
    values = [bytes([i]) + b"x" + bytes([i]) for i in range(1, 128)]
    rows = [[v, None, b""] for v in values] + [[b"\\N", b"\\.", None]]
    with pair.sub_conn() as conn, conn.cursor().copy("COPY r FROM STDIN") as copy:
        for row in rows:
            copy.write(text_row(row))
    got = pair.sub_exec("SELECT a, b, c FROM r")
    want = [tuple(None if v is None else v.decode() for v in row) for row in rows]
    assert sorted(got, key=repr) == sorted(want, key=repr)
