"""The spool directory: private, checked at start, and failures are one clear line.

Streamed transactions spill to ``[apply] spool_dir`` (see applier/apply/handlers/spool.py).
A directory others can write, a read-only or full file system, a transaction
beyond ``spool_limit`` and a symlink planted where a spool file goes must each end
in a one-line error naming the path (or be harmless), with nothing applied or
confirmed, never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from applykit import Runner, origin_lsn, wait_equal, wait_for
from conftest import Pair

from applier.apply.handlers.spool import check_spool_dir, default_spool_dir
from applier.config import config_from_dict
from applier.errors import ConfigError

BIG = "INSERT INTO t SELECT g, repeat('x', 500) FROM generate_series(1, 20000) g"


def _streaming_pair(pair: Pair, spool: Path, **apply: object) -> Runner:
    # The walsender reads it at start: big transactions are streamed in 64kB blocks.
    pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    # Spooled then applied at commit ("on"): live apply keeps no spool file.
    settings = {"streaming": "on", "memory_limit": "64kB", "spool_dir": str(spool), **apply}
    cfg = pair.write_config(apply=settings)
    return Runner(pair, cfg).start()


def _one_error_line(log: str, *needles: str) -> None:
    assert "Traceback" not in log, log[-3000:]
    lines = [line for line in log.splitlines() if all(n in line for n in needles)]
    assert lines, log[-3000:]


@contextlib.contextmanager
def _tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir(mode=0o700)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True)  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_default_spool_dir_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path}/state:{tmp_path}/other")
    assert default_spool_dir() == tmp_path / "state" / "spool"
    monkeypatch.delenv("STATE_DIRECTORY")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_spool_dir() == tmp_path / "xdg" / "applier" / "spool"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    spool = default_spool_dir()
    assert spool == tmp_path / "home" / ".local" / "state" / "applier" / "spool"
    old = os.umask(0o022)
    try:
        check_spool_dir(spool)
    finally:
        os.umask(old)
    assert spool.stat().st_mode & 0o777 == 0o700
    assert not list(spool.iterdir())  # the probe file is gone
    link = tmp_path / "link"
    link.symlink_to(spool)
    with pytest.raises(ConfigError, match="not a directory"):
        check_spool_dir(link)


# The spool is the worker's own directory: the checks come before any connection,
# and a streamed transaction is spooled the same whatever the target's version.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_spool_dir_writable_by_others_is_refused(pair: Pair) -> None:
    spool = pair.workdir / "spool"
    spool.mkdir()
    spool.chmod(0o777)
    runner = _streaming_pair(pair, spool)
    assert runner.wait(60) == 2
    _one_error_line(runner.log(), str(spool), "writable by others")


# The spool is the worker's own directory: the checks come before any connection,
# and a streamed transaction is spooled the same whatever the target's version.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_spool_dir_read_only_is_refused(pair: Pair) -> None:
    with _tmpfs(pair.workdir / "ro", "size=1m,ro,mode=0700") as spool:
        runner = _streaming_pair(pair, spool)
        assert runner.wait(60) == 2
        _one_error_line(runner.log(), str(spool), "cannot write a file there")


# The spool is the worker's own directory: the checks come before any connection,
# and a streamed transaction is spooled the same whatever the target's version.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_spool_full_is_one_line_and_advances_nothing(pair: Pair) -> None:
    with _tmpfs(pair.workdir / "full", "size=1m,mode=0700") as spool:
        runner = _streaming_pair(pair, spool).ready()
        pair.pub_exec("INSERT INTO t VALUES (0, 'before')")
        wait_equal(pair, ["t"], runner=runner)
        before = origin_lsn(pair, pair.slot)
        pair.pub_exec(BIG)  # ~10 MB spooled: the 1 MB file system fills up
        wait_for(lambda: "No space left on device" in runner.log(), 60, "ENOSPC")
        assert runner.alive()  # transient: it retries, the disk may be freed
        assert runner.stop() == 0
        _one_error_line(runner.log(), str(spool), "No space left on device", "retrying")
        assert pair.sub_exec("SELECT count(*) FROM t") == [(1,)]
        assert origin_lsn(pair, pair.slot) == before


# The spool is the worker's own directory: the checks come before any connection,
# and a streamed transaction is spooled the same whatever the target's version.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_spool_limit(pair: Pair) -> None:
    runner = _streaming_pair(pair, pair.workdir / "spool", spool_limit="1MB").ready()
    pair.pub_exec("INSERT INTO t VALUES (0, 'before')")
    wait_equal(pair, ["t"], runner=runner)
    before = origin_lsn(pair, pair.slot)
    pair.pub_exec(BIG)
    assert runner.wait(90) == 3
    _one_error_line(runner.log(), "spool_limit = 1048576", "streamed transaction")
    assert pair.sub_exec("SELECT count(*) FROM t") == [(1,)]
    assert origin_lsn(pair, pair.slot) == before


# The spool is the worker's own directory: the checks come before any connection,
# and a streamed transaction is spooled the same whatever the target's version.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_planted_symlink_is_not_followed(pair: Pair) -> None:
    spool = pair.workdir / "spool"
    victim = pair.workdir / "victim"
    victim.write_text("precious\n")
    runner = _streaming_pair(pair, spool).ready()
    spool.mkdir(mode=0o700, exist_ok=True)  # (applier creates it at start)
    planted = []
    with pair.pub_conn() as conn, conn.transaction():
        xid = conn.execute("SELECT txid_current()").fetchone()[0]  # type: ignore[index]
        link = spool / f"{pair.slot}-{xid}.spool"
        link.symlink_to(victim)
        planted.append(link)
        conn.execute(BIG)
    wait_equal(pair, ["t"], runner=runner, timeout=90)
    assert victim.read_text() == "precious\n"
    assert runner.stop() == 0
    assert "on_disk=True" in runner.log()  # it did spill, where the symlink was
    assert not planted[0].is_symlink()
    assert not list(spool.glob("*.spool"))


def test_spool_limit_and_target_timeout_are_validated() -> None:
    base = {"source": {"dsn": "host=x", "publications": ["p"]}, "target": {"dsn": "host=y"}}
    cfg = config_from_dict({**base, "apply": {"spool_limit": "2GB", "target_timeout": 5}})
    assert cfg.apply.spool_limit == 2 * 1024**3 and cfg.apply.target_timeout == 5
    assert config_from_dict(base).apply.spool_limit == 0  # no limit by default
    with pytest.raises(ConfigError, match=r"apply\.spool_limit: expected a size"):
        config_from_dict({**base, "apply": {"spool_limit": "lots"}})
    with pytest.raises(ConfigError, match=r"apply\.target_timeout"):
        config_from_dict({**base, "apply": {"target_timeout": 0}})
