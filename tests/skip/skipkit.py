"""Helpers for the skip tests: run `applier skip ...` as a real process, keep changes
in ``applier.skipped_changes`` as the worker would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import Pair

ROOT = Path(__file__).resolve().parents[2]


def applier(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", *map(str, args)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip


def add_rule(cfg: Path, *args: str) -> int:
    proc = applier("skip", "add", "--config", cfg, *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().isdigit(), proc.stdout  # only the id on stdout
    return int(proc.stdout)


def rules_json(cfg: Path, *args: str) -> list[dict[str, Any]]:
    proc = applier("skip", "list", "--config", cfg, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    rules = json.loads(proc.stdout)
    assert isinstance(rules, list)
    return rules


def keep(pair: Pair, origin: str, **row: Any) -> None:
    """One row of applier.skipped_changes, as the worker writes it."""
    for k in ("key", "old_row", "new_row"):
        if row.get(k) is not None:
            row[k] = json.dumps(row[k])
    row.setdefault("origin", origin)
    cols = ", ".join(row)
    marks = ", ".join(f"%({k})s" for k in row)
    with pair.sub_conn(autocommit=True) as conn:
        conn.execute(f"INSERT INTO applier.skipped_changes ({cols}) VALUES ({marks})", row)
