"""Shared fixtures of the verify tests: one local Spark for the whole session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkContext that verifies (and bootstraps) reuse instead of their own JVM."""
    from applier.bootstrap.spark import build_context
    from applier.config import BootstrapConfig

    sc = build_context(BootstrapConfig(spark_master="local[2]"))
    sc._applier_keep = True  # run_verify / run_bootstrap must not stop it
    yield sc
    sc.stop()
