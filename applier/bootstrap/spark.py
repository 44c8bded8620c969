"""The SparkSession of a bootstrap, built from ``[bootstrap]``.

Python workers must run our interpreter (they import ``applier`` to run the
copy tasks), so ``PYSPARK_PYTHON`` defaults to ``sys.executable``. Task
retries are safe (a slice's data and done-record commit together), so local
masters get a retry count too: ``local[N]`` alone never retries a task.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..config import BootstrapConfig


def master_with_retries(master: str, retries: int = 3) -> str:
    if master.startswith("local[") and "," not in master:
        return f"{master[:-1]},{retries}]"
    return master


def build_session(bcfg: BootstrapConfig) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master_with_retries(bcfg.spark_master))
        .appName("applier-bootstrap")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", "false")
    )
    for key, value in bcfg.spark_conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
