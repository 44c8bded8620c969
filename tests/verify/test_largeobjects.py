"""``applier verify`` compares large objects: OIDs, owners, ACLs and data hashed in each
server; a differing object is named by its OID, like a differing row."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import ONE_PAIR, Pair
from largeobjects.lokit import load, roles

from applier import largeobjects as lo
from applier import pgconn
from applier.verify import compare
from applier.verify.report import Report

pytestmark = pytest.mark.spark


def _objects(report: Report) -> Any:
    (t,) = [t for t in report.tables if t.table == "pg_catalog.pg_largeobject"]
    return t


@ONE_PAIR
def test_verify_equal_then_names_the_differing_oid(pair: Pair, spark: Any) -> None:
    with roles(pair) as r:
        load(pair, r)
        pair.both("CREATE TABLE t (id int PRIMARY KEY)")
        pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
        cfg = pair.config()
        # As a bootstrap leaves them (its copy is tested apart).
        with (
            pgconn.connect(pair.pub_dsn, side="source", purpose="test") as src,
            pgconn.connect(pair.sub_dsn, side="target", purpose="test") as tgt,
        ):
            lo.copy_objects(src, tgt, lo.metadata(src), replace=False)
        report = compare(cfg, rounds=1)
        assert report.equal, report.as_json()
        assert _objects(report).rows == 4 and _objects(report).differences == []

        # One byte on the target, one owner, one object the source lacks.
        pair.sub_exec(
            "SELECT lo_put(10004, 1000, 'X'::bytea);"
            f"ALTER LARGE OBJECT 10001 OWNER TO {r[2]};"
            "SELECT lo_from_bytea(10009, 'extra'::bytea)"
        )
        report = compare(cfg, rounds=1)
        assert not report.equal
        assert report.differing() == ["pg_catalog.pg_largeobject (3 rows)"]
        diffs = {d.key["oid"]: d.as_json() for d in _objects(report).differences if d.key}
        assert sorted(diffs) == [10001, 10004, 10009], diffs
        big = diffs[10004]
        assert big["source"]["size"] == big["target"]["size"] == 2_560_000
        assert big["source"]["md5"] != big["target"]["md5"]
        assert diffs[10001]["target"]["owner"] == r[2] != diffs[10001]["source"]["owner"]
        assert diffs[10009]["source"] is None
        # --tables naming only other tables leaves the objects out.
        report = compare(cfg, tables=["public.*"], rounds=1)
        assert report.equal and [t.table for t in report.tables] == ["public.t"]
