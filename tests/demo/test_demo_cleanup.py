"""``applier demo`` says nothing is left behind (without ``--keep``): its clusters'
directory, with the config and the worker's log it writes there, goes too."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from applier import demo


@pytest.fixture
def temp_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp directory the server user can reach (pytest's tmp_path is 0700, root's)."""
    root = Path(tempfile.mkdtemp(prefix="applier-demo-test-"))
    os.chmod(root, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("keep", [False, True], ids=["default", "keep"])
def test_the_demo_leaves_its_directory_only_when_kept(temp_root: Path, keep: bool) -> None:
    with demo._clusters(15, 18, keep) as (src, dst):
        base = src.datadir.parent
        assert base.parent == temp_root and base.name.startswith("applier-demo-")
        # What run_demo writes beside the clusters.
        config = demo._write_config(base, src, dst, "postgres")
        config.with_suffix(".log").write_text("the worker's log\n")
        assert src.execute("SELECT 1") == [(1,)]
    try:
        left = sorted(p.name for p in temp_root.iterdir())
        if keep:
            assert left == [base.name]
            assert config.is_file() and (base / "source15").is_dir()
        else:
            assert left == [], left
    finally:
        src.destroy()  # --keep leaves them running for the user
        dst.destroy()
