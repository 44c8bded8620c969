"""How soon a running worker sees a new skip rule: `skip --help` and the README say the
interval the worker really uses (they once said 5 s and 2 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from applier.apply.rules.skiprules import REFRESH_INTERVAL

ROOT = Path(__file__).resolve().parents[2]


def test_help_and_readme_state_the_workers_refresh_interval() -> None:
    said = f"{REFRESH_INTERVAL:g} s"
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "skip", "--help"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    help_text = " ".join(proc.stdout.split())
    assert f"within {said}" in help_text, help_text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"a running worker reads them every {said}" in readme
