"""A command that needs Java says so before it connects anywhere (here pyspark is installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Pair

ROOT = Path(__file__).resolve().parents[2]


#: Slots of this test's database only: the cluster is shared with other tests.
_SLOTS_OF_THIS_DB = (
    "SELECT count(*) FROM pg_replication_slots WHERE database = pg_catalog.current_database()"
)


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_bootstrap_without_java_says_so(pair: Pair, tmp_path: Path) -> None:
    pair.pub_exec("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t;")
    config = pair.write_config()
    no_java = tmp_path / "jdk"  # a JAVA_HOME without bin/java: what Spark's launcher runs
    no_java.mkdir()
    for args in (["bootstrap", "--config", str(config)], ["spark-archive"]):
        proc = subprocess.run(
            [sys.executable, "-m", "applier.cli", *args],
            env={**os.environ, "JAVA_HOME": str(no_java)},
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert "needs a Java runtime" in proc.stderr and str(no_java) in proc.stderr
        assert "Traceback" not in proc.stderr
    assert pair.pub_exec(_SLOTS_OF_THIS_DB) == [(0,)]
