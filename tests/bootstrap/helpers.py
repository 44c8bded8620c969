"""Schema, data and comparisons shared by the bootstrap tests."""

from __future__ import annotations

from typing import Any

from conftest import Pair

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE big (id bigserial PRIMARY KEY, payload text, n int);
CREATE INDEX big_n ON big (n);
CREATE TABLE parted (id int, region text, v numeric(10, 2), PRIMARY KEY (id, region))
  PARTITION BY LIST (region);
CREATE TABLE parted_eu PARTITION OF parted FOR VALUES IN ('eu');
CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us');
CREATE TABLE types (
  id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  b boolean, i2 smallint, i8 bigint, f4 real, f8 double precision, num numeric(12, 4),
  t text, vc varchar(20), ch char(3), by bytea, d date, ts timestamp, tstz timestamptz,
  tm time, iv interval, u uuid, j json, jb jsonb, arr int[], tarr text[], inet_ inet,
  m mood, marr mood[], twice int GENERATED ALWAYS AS (i2 * 2) STORED
);
CREATE TABLE nopk (a int, b text);
ALTER TABLE nopk REPLICA IDENTITY FULL;
ALTER TABLE nopk SET (autovacuum_enabled = off, toast.autovacuum_enabled = off);
ALTER TABLE types SET (toast.autovacuum_enabled = true, fillfactor = 90);
CREATE PUBLICATION pub FOR TABLE big, parted, types, nopk;
"""


def load(pair: Pair, big_rows: int = 20_000) -> None:
    pair.pub_exec(SCHEMA)
    pair.pub_exec(
        f"INSERT INTO big (payload, n) SELECT repeat(md5(g::text), 3), g % 97 "
        f"FROM generate_series(1, {big_rows}) g;"
        "INSERT INTO parted SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g / 7.0 "
        "FROM generate_series(1, 3000) g;"
        "INSERT INTO nopk SELECT g, 'x' || g FROM generate_series(1, 500) g;"
        "INSERT INTO types (b, i2, i8, f4, f8, num, t, vc, ch, by, d, ts, tstz, tm, iv, u, j, jb,"
        " arr, tarr, inet_, m, marr) "
        "SELECT g % 2 = 0, g, g::bigint * 1000000000, g / 3.0, g / 7.0, g / 11.0,"
        " 'ü ' || g, 'v' || g,"
        " 'c', decode(md5(g::text), 'hex'), '2024-01-01'::date + g, '2024-01-01'::timestamp"
        " + g * interval '1 min', now(), '12:00'::time, g * interval '1 day',"
        " md5(g::text)::uuid, json_build_object('g', g), jsonb_build_object('g', g),"
        " ARRAY[g, g + 1], ARRAY['a', NULL], '10.0.0.1', 'ok', ARRAY['sad', 'happy']::mood[]"
        " FROM generate_series(1, 300) g;"
        "INSERT INTO types (t) VALUES (NULL);"
    )


TABLES = ["big", "parted", "types", "nopk"]


def rows(pair: Pair, side: str, table: str) -> list[tuple[Any, ...]]:
    q = f"SELECT t::text FROM {table} t ORDER BY 1"
    return pair.pub_exec(q) if side == "pub" else pair.sub_exec(q)


def assert_same(pair: Pair, tables: list[str] = TABLES) -> None:
    for t in tables:
        src, dst = rows(pair, "pub", t), rows(pair, "sub", t)
        assert len(src) == len(dst), f"{t}: {len(src)} rows on the source, {len(dst)} on the target"
        assert src == dst, f"{t}: rows differ"
