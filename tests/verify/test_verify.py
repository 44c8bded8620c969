"""``applier verify`` on real servers (15->15, 15->18) with a real local Spark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bootstrap.helpers import load
from conftest import ONE_PAIR, Pair

from applier.bootstrap.job import run_bootstrap
from applier.verify import run_verify

pytestmark = pytest.mark.spark


def _bootstrapped(pair: Pair, **sections: dict[str, Any]) -> Any:
    load(pair)
    cfg = pair.config(bootstrap={"slice_size": "1MB"}, **sections)
    assert run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True) == 0
    return cfg


def _report(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out = capsys.readouterr().out
    return dict(json.loads(out))


@ONE_PAIR
def test_equal_after_bootstrap(pair: Pair, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # Every type of the bootstrap's sample (floats, timestamps, intervals,
    # arrays, enums, json, NULLs) prints alike on 15 and 18; a partitioned
    # table, a keyless table; many ranges (chunk_rows) for the 20k-row table.
    cfg = _bootstrapped(pair)
    assert run_verify(cfg, chunk_rows=1000, as_json=True) == 0
    report = _report(capsys)
    assert report["equal"] is True and report["schema"] == []
    tables = {t["table"]: t for t in report["tables"]}
    assert set(tables) == {"public.big", "public.parted_eu", "public.parted_us", "public.types",
                           "public.nopk"}  # fmt: skip
    assert tables["public.big"]["rows"] == 20_000
    assert tables["public.big"]["ranges"] > 5
    assert tables["public.nopk"]["keyed"] is False
    assert all(t["differences"] == [] for t in report["tables"])


@ONE_PAIR
def test_differences_named_by_key(
    pair: Pair, spark: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Small fetch_rows: the differing 1000-row ranges are cut and hashed again
    # before their rows are read.
    cfg = _bootstrapped(pair, verify={"fetch_rows": 40})
    pair.sub_exec(
        "UPDATE big SET payload = 'changed' WHERE id = 777;"
        "DELETE FROM big WHERE id = 12345;"
        "INSERT INTO big (id, payload, n) VALUES (99999, 'extra', 1);"
        "UPDATE types SET t = NULL WHERE id = 5;"  # NULL vs a value
        "UPDATE types SET t = '' WHERE id = 301;"  # '' vs NULL
        "INSERT INTO nopk VALUES (1, 'x1');"  # a duplicate of an existing row
        "UPDATE parted SET v = 0 WHERE id = 1000 AND region = 'eu';"  # a two-column key
        "ALTER TABLE types ALTER COLUMN vc TYPE varchar(30);"
        "DROP INDEX big_n;"
        "SELECT setval('big_id_seq', 5);"
    )
    diff_out = tmp_path / "diff.jsonl"
    assert run_verify(cfg, chunk_rows=1000, rounds=2, as_json=True, diff_out=diff_out) == 1
    report = _report(capsys)
    assert report["equal"] is False
    tables = {t["table"]: t for t in report["tables"]}
    big = {d["key"]["id"]: d for d in tables["public.big"]["differences"]}
    assert set(big) == {777, 12345, 99999}
    assert big[777]["source"]["payload"] != "changed" and big[777]["target"]["payload"] == "changed"
    assert big[12345]["source"]["id"] == 12345 and big[12345]["target"] is None
    assert big[99999]["source"] is None and big[99999]["target"]["payload"] == "extra"
    types = {d["key"]["id"]: d for d in tables["public.types"]["differences"]}
    assert set(types) == {5, 301}
    assert types[5]["target"]["t"] is None and types[301]["source"]["t"] is None
    assert types[301]["target"]["t"] == ""
    nopk = tables["public.nopk"]["differences"]
    assert tables["public.nopk"]["keyed"] is False
    assert [(d["key"], d["source_count"], d["target_count"]) for d in nopk] == [(None, 1, 2)]
    assert nopk[0]["target"] == {"a": 1, "b": "x1"}
    eu = tables["public.parted_eu"]["differences"]
    assert [d["key"] for d in eu] == [{"id": 1000, "region": "eu"}]
    assert (eu[0]["source"]["v"], eu[0]["target"]["v"]) == (142.86, 0)
    assert tables["public.parted_us"]["differences"] == []

    schema = {(s["kind"], s["table"], s["problem"]): s for s in report["schema"]}
    assert len(report["schema"]) == 3, report["schema"]
    col = schema[("column", "public.types", "type differs")]
    assert (col["name"], col["source"], col["target"]) == (
        "vc", "character varying(20)", "character varying(30)"
    )  # fmt: skip
    idx = schema[("index", "public.big", "missing on the target")]
    assert idx["source"] == "CREATE INDEX ON public.big USING btree (n)"
    seq = schema[("sequence", "public.big_id_seq", "behind the source (next value)")]
    assert (seq["source"], seq["target"]) == (20_001, 6)

    lines = [json.loads(x) for x in diff_out.read_text().splitlines()]
    assert len(lines) == 3 + 2 + 1 + 1
    assert {x["key"]["id"] for x in lines if x["table"] == "public.big"} == {777, 12345, 99999}
