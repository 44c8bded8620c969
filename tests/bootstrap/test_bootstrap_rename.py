"""A table renamed on the source between the bootstrap's snapshot and the stream."""

from __future__ import annotations

from typing import Any

import pytest
from apply.applykit import Runner, wait_equal
from conftest import ONE_PAIR, Pair

from applier.bootstrap.job import run_bootstrap
from applier.config import load_config

pytestmark = pytest.mark.spark


@ONE_PAIR
def test_table_renamed_after_the_snapshot_stops_the_first_run(pair: Pair, spark: Any) -> None:
    """The worker has never applied the table when its first change comes under the
    new name: the bootstrap's record of its OID tells it is not a new table."""
    pair.pub_exec(
        "CREATE TABLE a (id int PRIMARY KEY, n int); INSERT INTO a VALUES (1, 0);"
        "CREATE PUBLICATION pub FOR TABLE a"
    )
    path = pair.write_config()
    assert run_bootstrap(load_config(path), recreate_slot=False, truncate=False, quiet=True) == 0
    pair.pub_exec("ALTER TABLE a RENAME TO b; INSERT INTO b VALUES (2, 0)")
    runner = Runner(pair, path).start()
    assert runner.wait(60) == 3
    assert "table public.a was renamed on the source to public.b" in runner.log()
    assert pair.sub_exec("SELECT count(*) FROM applier.table_sync WHERE state = 'skipped'") == [
        (0,)
    ]
    pair.sub_exec("ALTER TABLE a RENAME TO b")
    runner = Runner(pair, path).start().ready()
    wait_equal(pair, ["b"], runner=runner)
    assert pair.sub_exec("SELECT id FROM b ORDER BY id") == [(1,), (2,)]
    assert runner.stop() == 0
