"""Binary COPY and user-defined types whose OIDs differ between the clusters (issue 12,
item 9): composites go as text, arrays of enums and domains stay binary."""

from __future__ import annotations

from typing import Any

from conftest import Pair

from applier.bootstrap.job import run_bootstrap
from bootstrap.helpers import assert_same

# The schema of tests/apply/test_apply_binary_types.py.
SOURCE = """
CREATE TYPE e AS ENUM ('a', 'b');
CREATE TYPE c AS (x e, y int4);
CREATE DOMAIN d AS e;
CREATE TYPE cb AS (x int4, y text);
"""
TARGET = """
CREATE TYPE shift AS ENUM ('z');
CREATE TYPE cb AS (x int8, y text);
CREATE TYPE e AS ENUM ('a', 'b');
CREATE TYPE c AS (x e, y int4);
CREATE DOMAIN d AS e;
"""
TABLES = """
CREATE TABLE arr (id int PRIMARY KEY, ea e[], dd d, da d[], en e);
CREATE TABLE comp (id int PRIMARY KEY, cc c, cbb cb, cba cb[], ca c[]);
"""
ARR_ROWS = "INSERT INTO arr SELECT g, '{a,b}', 'b', '{a,b}', 'a' FROM generate_series(1, 50) g"
COMP_ROWS = (
    "INSERT INTO comp SELECT g, '(a,1)', ROW(g, 'x')::cb, ARRAY[ROW(g, 'y')::cb], "
    "ARRAY['(b,2)']::c[] FROM generate_series(1, 50) g"
)


def test_bootstrap_user_types_other_oids(pair: Pair, spark: Any) -> None:
    pair.pub_exec(SOURCE + TABLES + ARR_ROWS + ";" + COMP_ROWS)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.sub_exec(TARGET + TABLES)
    assert run_bootstrap(pair.config(), recreate_slot=False, truncate=False, quiet=True) == 0
    assert_same(pair, ["arr", "comp"])
