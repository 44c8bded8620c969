"""The shell completion the README documents (click's) completes applier's commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _complete(env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", "from applier.cli import main; main()"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_bash_completion_script_and_a_completed_command() -> None:
    assert "_applier_completion" in _complete({"_APPLIER_COMPLETE": "bash_source"})
    readme = (ROOT / "README.md").read_text()
    assert 'eval "$(_APPLIER_COMPLETE=bash_source applier)"' in readme
    words = {"_APPLIER_COMPLETE": "bash_complete", "COMP_WORDS": "applier sk", "COMP_CWORD": "1"}
    assert "plain,skip" in _complete(words).splitlines()
