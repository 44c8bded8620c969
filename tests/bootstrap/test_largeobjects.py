"""Bootstrap copies large objects with the tables (same snapshot), cutover the rest."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ONE_PAIR, Pair
from largeobjects.lokit import load, roles, state

from applier.bootstrap.job import run_bootstrap

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cutover"))
from test_cutover import _cutover

pytestmark = pytest.mark.spark


@ONE_PAIR
def test_bootstrap_copies_large_objects_and_cutover_the_later_ones(pair: Pair, spark: Any) -> None:
    with roles(pair) as r:
        load(pair, r)
        pair.pub_exec(
            "CREATE TABLE docs (id int PRIMARY KEY, doc oid);"
            "INSERT INTO docs VALUES (1, 10002), (2, 10004);"
            "CREATE PUBLICATION pub FOR TABLE docs"
        )
        cfg = pair.write_config()
        from applier.config import load_config

        assert run_bootstrap(load_config(cfg), recreate_slot=False, truncate=False, quiet=True) == 0
        assert state(pair, "sub") == state(pair, "pub")  # owners, ACLs, md5 of the data
        assert pair.sub_exec("SELECT count(*) FROM docs") == [(2,)]

        # After the bootstrap (its snapshot): one created, one deleted; writes then stop.
        pair.pub_exec(
            "INSERT INTO docs SELECT 3, lo_from_bytea(10007, 'after'::bytea);"
            "SELECT lo_unlink(10001)"
        )
        assert [x[0] for x in state(pair, "sub")] == [10001, 10002, 10003, 10004]
        rc, rep, err = _cutover(cfg)
        assert rc == 0, (rep, err[-3000:])
        assert rep["large_objects"]["created"] == 1 and rep["large_objects"]["deleted"] == 1
        assert state(pair, "sub") == state(pair, "pub")
        assert [x[0] for x in state(pair, "sub")] == [10002, 10003, 10004, 10007]
