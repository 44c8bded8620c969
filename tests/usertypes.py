"""User-defined types whose OIDs differ between the clusters (issue 12, item 9),
shared by the apply and bootstrap binary-format tests."""

#: User-defined types created in another order on the target (so their OIDs differ), and a
#: composite whose member type differs (int4 -> int8: text converts, binary cannot).
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
