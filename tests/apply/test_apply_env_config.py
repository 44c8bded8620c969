"""`applier run` configured by the environment: APPLIER_CONFIG names a file without
DSNs, APPLIER_SOURCE_DSN / APPLIER_TARGET_DSN supply them, an override changes a key."""

from __future__ import annotations

import pytest
from applykit import Runner, wait_equal
from conftest import Pair


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_run_with_the_dsns_from_the_environment(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    path = pair.workdir / "nodsn.toml"
    path.write_text(
        f'[source]\npublications = ["pub"]\nslot = "{pair.slot}"\n'
        "[apply]\nstatus_interval = 1.0\ntimeout = 20.0\n"
    )  # no [target] at all: it comes from the environment
    env = {
        "APPLIER_CONFIG": str(path),
        "APPLIER_SOURCE_DSN": pair.pub_dsn,
        "APPLIER_TARGET_DSN": pair.sub_dsn,
        "APPLIER_LOGGING__FORMAT": "json",
    }
    runner = Runner(pair, None, env=env).start().ready()
    pair.pub_exec("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    first = runner.log().splitlines()[0]
    assert first.startswith("{"), first  # the override reached the worker
