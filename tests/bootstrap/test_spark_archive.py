"""The driver JVM's class archive: written by `applier spark-archive`, used, survived damaged.

Real JVMs in child processes (a session in this process would be the shared
test session, started long before).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from applier.bootstrap.spark import _usable_archive, archive_path
from applier.config import BootstrapConfig

pytestmark = pytest.mark.spark

SESSION = """
import json, sys
from applier.bootstrap.spark import build_context
from applier.config import BootstrapConfig
from applier.log import setup_logging
setup_logging("info", "json")
sc = build_context(BootstrapConfig(spark_master="local[1]", class_archive=sys.argv[1]))
bean = sc._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print(json.dumps({"args": list(bean.getInputArguments()),
                  "n": sc.parallelize(range(3), 1).count()}))
sc.stop()
"""


def _run(*argv: str, tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    if tmp is not None:  # where a crashing JVM leaves its report
        env["TMPDIR"] = str(tmp)
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=300, env=env
    )


def _session(archive: Path) -> dict[str, Any]:
    proc = _run("-c", SESSION, str(archive), tmp=archive.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


def test_archive_written_used_and_a_damaged_one_dropped(tmp_path: Path) -> None:
    archive = tmp_path / "classes.jsa"
    cfg = tmp_path / "a.toml"
    cfg.write_text(
        '[source]\ndsn = "host=h dbname=d"\npublications = ["p"]\nslot = "s"\n'
        '[target]\ndsn = "host=h dbname=d"\n'
        f'[bootstrap]\nspark_master = "local[1]"\nclass_archive = "{archive}"\n'
    )
    proc = _run("-m", "applier.cli", "spark-archive", "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"class archive written: {archive}" in proc.stdout
    assert archive.stat().st_size > 10 * 2**20
    assert not list(tmp_path.glob(".*.tmp"))  # written aside, then renamed

    used = _session(archive)
    assert f"-XX:SharedArchiveFile={archive}" in used["args"] and used["n"] == 3

    # A cut archive makes this JVM crash as it maps it: the session starts
    # again without it, and the file is removed so the next start is clean.
    head = archive.read_bytes()[: 2**20]
    archive.chmod(0o644)
    archive.write_bytes(head)
    fallback = _session(archive)
    assert fallback["n"] == 3
    assert not any("SharedArchiveFile" in a for a in fallback["args"])
    assert not archive.exists()
    assert "Spark did not start with the class archive" in fallback["stderr"]
    assert list(tmp_path.glob("applier-spark-hs_err_pid*.log"))  # not in the working dir


def test_archive_turned_off_is_a_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "a.toml"
    cfg.write_text(
        '[source]\ndsn = "host=h dbname=d"\npublications = ["p"]\nslot = "s"\n'
        '[target]\ndsn = "host=h dbname=d"\n[bootstrap]\nclass_archive = "off"\n'
    )
    proc = _run("-m", "applier.cli", "spark-archive", "--config", str(cfg))
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1
    assert ' applier: error: bootstrap.class_archive is "off"' in last, last


def test_archive_settings(tmp_path: Path) -> None:
    present = tmp_path / "a.jsa"
    present.write_bytes(b"x")
    assert _usable_archive(BootstrapConfig(class_archive=str(present))) == present
    assert _usable_archive(BootstrapConfig(class_archive=str(tmp_path / "none.jsa"))) is None
    assert _usable_archive(BootstrapConfig(class_archive="off")) is None
    # The user's own JVM options win: no archive added to them.
    own = {"spark.driver.extraJavaOptions": "-Xmx1g"}
    assert _usable_archive(BootstrapConfig(class_archive=str(present), spark_conf=own)) is None
    assert archive_path(BootstrapConfig()) is not None  # "auto": a per-user cache file
