"""verify's schema differences, one line per table with both sides' types (no Spark:
the schema half reads the catalogs only)."""

from __future__ import annotations

import pytest
from conftest import Pair

from applier.verify.report import schema_lines
from applier.verify.schema import compare_schema


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_columns_that_differ_are_one_line_per_table(pair: Pair) -> None:
    pair.pub_exec("CREATE TABLE t (id int PRIMARY KEY, n numeric(12,2), d int, keep text)")
    pair.sub_exec("CREATE TABLE t (id int PRIMARY KEY, n numeric(6,2), keep text, old int)")
    pair.both("CREATE TABLE same (id int PRIMARY KEY)")
    with pair.pub_conn() as src, pair.sub_conn() as tgt:
        diffs = compare_schema(src, tgt, [("public", "t"), ("public", "same")])
    assert schema_lines(diffs) == [
        "public.t: column d missing on the target (source integer); "
        "column n type differs (source numeric(12,2), target numeric(6,2)); "
        "column old only on the target (target integer)"
    ]
