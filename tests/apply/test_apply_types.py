"""Every data type arrives equal; partitioned tables on either side."""

from __future__ import annotations

import pytest
from applykit import Runner, wait_equal
from conftest import Pair

TYPES_DDL = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TYPE pair AS (x int, label text);
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE ty (
    id int PRIMARY KEY,
    arr int[], tarr text[], m mood, marr mood[], c pair, carr pair[], d posint,
    r int4range, tr tstzrange, {multirange}
    j json, jb jsonb, n numeric, n2 numeric(12, 4), f8 float8, f4 float4,
    ts timestamp, tstz timestamptz, dt date, tm time, tmtz timetz, iv interval,
    b bytea, u uuid, inet_ inet, bits bit varying, money_ money, pt point,
    big text {hstore}
);
"""

INSERTS = """
SET TIME ZONE 'America/New_York';
INSERT INTO ty SELECT g,
    ARRAY[g, NULL, g + 1], ARRAY['a"b', NULL, 'c,d', '{x}'], 'happy', '{sad,NULL,ok}',
    ROW(g, 'l"' || g)::pair, ARRAY[ROW(g, NULL)::pair, NULL, ROW(NULL, 'z')::pair], g,
    int4range(g, g + 10), tstzrange('2024-03-10 01:00-05', '2024-11-03 01:30-04'), @MR@
    '{"a": [1, 2.50, null]}', '{"b": {"c": "\\u00e9"}}', 1e-20 + g, 12345678.1234,
    1.0 / 3, 'NaN', '2024-02-29 23:59:59.999999', '2024-06-01 12:00:00+05:30', '0001-01-01 BC',
    '24:00:00', '23:59:59+14:59', '1 year -2 mons 3 days 04:05:06.7',
    '\\x00ff10', gen_random_uuid(), '192.168.0.1/24', B'10101', 12.34,
    point(g, -g), repeat('toast', 5000) @HS@
FROM generate_series(1, 20) g;
INSERT INTO ty (id) VALUES (100);
SET TIME ZONE 'Asia/Kathmandu';
INSERT INTO ty (id, tstz, ts) VALUES (101, '1999-12-31 23:59:59.5+05:45', 'infinity');
UPDATE ty SET c = ROW(NULL, NULL)::pair, arr = '{}' WHERE id = 3;
"""


def _hstore(pair: Pair) -> bool:
    try:
        pair.both("CREATE EXTENSION hstore")
        return True
    except Exception:
        return False


def test_all_types_round_trip(pair: Pair) -> None:
    has_hs = _hstore(pair)
    mr = pair.pub.version >= 14 and pair.sub.version >= 14
    ddl = TYPES_DDL.format(
        multirange="mr int4multirange," if mr else "", hstore=", hs hstore" if has_hs else ""
    )
    pair.both(ddl)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec(
        INSERTS.replace("@MR@", "'{[1,3), [7,9)}'," if mr else "").replace(
            "@HS@", """, 'a=>1, "b c"=>NULL'""" if has_hs else ""
        )
    )
    wait_equal(pair, ["ty"], runner=runner)
    # ::text of every column too (row_to_json renders json, so compare both ways).
    q = "SELECT ty::text FROM ty ORDER BY id"
    assert pair.pub_exec(q) == pair.sub_exec(q)
    assert runner.stop() == 0


def test_composite_and_enum_as_key_full_identity(pair: Pair) -> None:
    pair.both(
        "CREATE TYPE pair AS (x int, label text);"
        "CREATE TYPE mood AS ENUM ('sad', 'ok');"
        "CREATE TABLE k (c pair, m mood, v int, PRIMARY KEY (c, m));"
        "CREATE TABLE f (c pair, j jsonb, p point, v int);"
        "ALTER TABLE f REPLICA IDENTITY FULL"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec(
        "INSERT INTO k SELECT ROW(g, 'x' || g)::pair, 'ok', g FROM generate_series(1, 10) g;"
        "INSERT INTO f SELECT ROW(g, NULL)::pair, '{\"a\": 1}', point(g, g), g "
        "FROM generate_series(1, 10) g;"
        "UPDATE k SET v = v + 100 WHERE (c).x < 5; UPDATE k SET m = 'sad' WHERE (c).x = 7;"
        "DELETE FROM k WHERE (c).x = 9;"
        "UPDATE f SET v = -v WHERE (c).x < 5; DELETE FROM f WHERE (c).x = 9"
    )
    wait_equal(pair, ["k", "f"], runner=runner)
    assert runner.stop() == 0


@pytest.mark.parametrize("via_root", [True, False])
def test_partitioned_tables(pair: Pair, via_root: bool) -> None:
    pair.pub_exec(
        "CREATE TABLE m (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k);"
        "CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (0) TO (50);"
        "CREATE TABLE m2 PARTITION OF m FOR VALUES FROM (50) TO (100);"
        "CREATE TABLE full_p (id int, k int, v text) PARTITION BY LIST (k);"
        "CREATE TABLE full_p0 PARTITION OF full_p FOR VALUES IN (0);"
        "CREATE TABLE full_p1 PARTITION OF full_p FOR VALUES IN (1);"
        "ALTER TABLE full_p0 REPLICA IDENTITY FULL; ALTER TABLE full_p1 REPLICA IDENTITY FULL"
    )
    if via_root:
        # The target: plain m, partitioned full_p with a different layout.
        pair.sub_exec(
            "CREATE TABLE m (id int, k int, v text, PRIMARY KEY (id, k));"
            "CREATE TABLE full_p (id int, k int, v text) PARTITION BY HASH (id);"
            "CREATE TABLE full_h0 PARTITION OF full_p FOR VALUES WITH (MODULUS 2, REMAINDER 0);"
            "CREATE TABLE full_h1 PARTITION OF full_p FOR VALUES WITH (MODULUS 2, REMAINDER 1)"
        )
        pair.pub_exec(
            "CREATE PUBLICATION pub FOR TABLE m, full_p WITH (publish_via_partition_root = true);"
            "ALTER TABLE full_p REPLICA IDENTITY FULL"
        )
        tables = ["m", "full_p"]
    else:
        # The target gets the leaf tables as plain tables.
        pair.sub_exec(
            "CREATE TABLE m1 (id int, k int, v text, PRIMARY KEY (id, k));"
            "CREATE TABLE m2 (id int, k int, v text, PRIMARY KEY (id, k));"
            "CREATE TABLE full_p0 (id int, k int, v text);"
            "CREATE TABLE full_p1 (id int, k int, v text)"
        )
        pair.pub_exec("CREATE PUBLICATION pub FOR TABLE m, full_p")
        tables = ["m1", "m2", "full_p0", "full_p1"]
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec(
        "INSERT INTO m SELECT g, g % 100, 'v' FROM generate_series(1, 300) g;"
        "INSERT INTO full_p SELECT g, g % 2, 'v' FROM generate_series(1, 40) g;"
        "INSERT INTO full_p VALUES (1, 1, 'v'), (1, 1, 'v');"
        "UPDATE m SET v = 'u' WHERE id % 3 = 0;"
        "UPDATE full_p SET v = 'u' WHERE id % 3 = 0;"
        "DELETE FROM m WHERE id % 10 = 0; DELETE FROM full_p WHERE id % 10 = 0"
    )
    wait_equal(pair, tables, runner=runner, order="t.id, t.k, t.v")
    pair.pub_exec("TRUNCATE m")
    wait_equal(pair, tables, runner=runner, order="t.id, t.k, t.v")
    assert runner.stop() == 0
