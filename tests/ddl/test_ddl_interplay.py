"""Captured DDL (``applier ddl install``'s real trigger) meeting the other jobs: a bootstrap
copying while the source's schema changes, sync-tables copying a table that is altered,
verify comparing the schemas afterwards (issue 33 item 5). Real servers, a real local Spark."""

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

import pytest
from apply.applykit import Runner, wait_equal, wait_for
from conftest import Pair
from ddlkit import cli
from synctables.synckit import Writer, finish, setup, sync_tables, wait_state

from applier.bootstrap.job import run_bootstrap
from applier.config import load_config
from applier.verify import run_verify

pytestmark = pytest.mark.spark

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """One local[2] SparkContext for the bootstraps and verifies of this module."""
    from applier.bootstrap.spark import build_context
    from applier.config import BootstrapConfig

    sc = build_context(BootstrapConfig(spark_master="local[2]"))
    sc._applier_keep = True  # run_bootstrap / run_verify must not stop it
    yield sc
    sc.stop()


def _install(cfg: Path) -> None:
    done = cli("ddl", "install", "--config", cfg)
    assert done.returncode == 0, done.stderr


def _columns(query: Any, table: str) -> list[tuple[Any, ...]]:
    return query(
        "SELECT column_name, data_type, column_default FROM information_schema.columns "
        f"WHERE table_schema = 'public' AND table_name = '{table}' ORDER BY ordinal_position"
    )


def _applied(pair: Pair) -> list[tuple[Any, ...]]:
    """Each captured statement the target ran, with how many times."""
    if pair.sub_exec(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'applier' "
        "AND tablename = 'schema_changes'"
    ) != [(1,)]:
        return []
    return pair.sub_exec(
        "SELECT statement, count(*) FROM applier.schema_changes WHERE source = 'ddl' "
        "GROUP BY statement ORDER BY min(id)"
    )


def _wait_applied(pair: Pair, runner: Runner, statements: list[str]) -> None:
    def done() -> bool:
        assert runner.alive(), runner.log()[-4000:]
        return [s for s, _ in _applied(pair)] == statements

    wait_for(done, 120, f"{statements} applied")
    assert _applied(pair) == [(s, 1) for s in statements]


def _verify(cfg: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = run_verify(load_config(cfg), chunk_rows=1000, as_json=True)
    return code, dict(json.loads(capsys.readouterr().out))


def _finish(proc: subprocess.Popen[str], runner: Runner) -> tuple[int, str]:
    """sync-tables' exit and output; if it waits on past 120 s, the worker's log says why."""
    try:
        return finish(proc, timeout=120)
    except subprocess.TimeoutExpired as e:
        proc.kill()
        out = e.output.decode() if isinstance(e.output, bytes) else str(e.output)
        raise AssertionError(
            f"sync-tables still running:\n{out[-2000:]}\n--- worker ---\n{runner.log()[-4000:]}"
        ) from None


ALTER = "ALTER TABLE t ADD COLUMN w int DEFAULT 7"
CREATE = "CREATE TABLE n (id int PRIMARY KEY, v text)"


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_ddl_while_the_bootstrap_copies_is_applied_once_from_the_stream(
    pair: Pair, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The capture installed first; once the bootstrap's slot and snapshot exist (phase
    'copy'), a column with a DEFAULT is added and a table created and filled on the source.
    The copy sees neither (its snapshot is older); the stream carries both, once."""
    pair.pub_exec(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        "INSERT INTO t SELECT g, repeat(md5(g::text), 4) FROM generate_series(1, 30000) g;"
        "CREATE PUBLICATION pub FOR ALL TABLES"
    )
    cfg = pair.write_config(bootstrap={"slice_size": "64kB"})
    _install(cfg)
    result: list[int | BaseException] = []

    def bootstrap() -> None:
        try:
            result.append(
                run_bootstrap(load_config(cfg), recreate_slot=False, truncate=False, quiet=True)
            )
        except BaseException as e:  # reported below
            result.append(e)

    thread = threading.Thread(target=bootstrap, daemon=True)
    thread.start()
    phase = (
        "SELECT phase FROM applier.bootstrap_run WHERE EXISTS (SELECT FROM pg_tables "
        "WHERE schemaname = 'applier' AND tablename = 'bootstrap_run')"
    )
    wait_for(lambda: bool(result) or pair.sub_exec(phase) == [("copy",)], 120, "the copy phase")
    with pair.pub_conn() as conn:  # autocommit; a lock wait behind the copy is bounded
        conn.execute("SET statement_timeout = '120s'")
        for statement in (
            ALTER,
            "INSERT INTO t (id, v) VALUES (30001, 'after the snapshot')",
            "UPDATE t SET v = 'changed' WHERE id = 5",
            CREATE,
            "INSERT INTO n SELECT g, md5(g::text) FROM generate_series(1, 300) g",
        ):
            conn.execute(statement.encode())
    thread.join(300)
    assert result == [0], result
    # The copy is of the snapshot: neither the column nor the table is there yet.
    assert [c for c, *_ in _columns(pair.sub_exec, "t")] == ["id", "v"]
    runner = Runner(pair, cfg).start().ready()
    _wait_applied(pair, runner, [ALTER, CREATE])
    wait_equal(pair, ["t", "n"], runner=runner, order="id")
    assert _columns(pair.sub_exec, "t") == _columns(pair.pub_exec, "t")
    assert pair.sub_exec("SELECT count(*) FROM t WHERE w = 7") == [(30001,)]
    assert runner.stop() == 0
    code, report = _verify(cfg, capsys)
    assert (code, report["equal"], report["schema"]) == (0, True, []), report


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_ddl_on_a_table_sync_tables_is_copying(pair: Pair) -> None:
    """t_new added to the publication (not captured: sync-tables is run by hand) while the
    worker and a writer run; during its copy a column is added to it on the source."""
    rows = 20_000
    setup(pair, rows)
    cfg = pair.write_config(apply={"status_interval": 1.0, "timeout": 20.0})
    _install(cfg)
    runner = Runner(pair, cfg).start().ready()
    writer = Writer(pair, rows).start()
    with pair.pub_conn(autocommit=False) as conn:
        conn.execute("SET LOCAL applier_ddl.capture = off")
        conn.execute("ALTER PUBLICATION pub ADD TABLE t_new")
        conn.commit()
    wait_for(lambda: "run `applier sync-tables" in runner.log(), 30, "the worker's warning")
    proc = sync_tables(cfg)
    wait_state(pair, {"copying"}, proc)
    added = "ALTER TABLE t_new ADD COLUMN extra int DEFAULT 5"
    with pair.pub_conn() as conn:
        conn.execute("SET statement_timeout = '120s'")
        conn.execute(added)
        conn.execute("UPDATE t_new SET extra = 6 WHERE id % 100 = 0")
    code, out = _finish(proc, runner)
    assert code == 0, out
    time.sleep(0.5)
    writer.stop()
    wait_equal(pair, ["a", "t_new"], timeout=120, runner=runner, order="id")
    assert _columns(pair.sub_exec, "t_new") == _columns(pair.pub_exec, "t_new")
    assert [(s, n) for s, n in _applied(pair) if "t_new" in s] == [(added, 1)]
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_verify_after_ddl_equal_when_followed_and_names_what_was_not(
    pair: Pair, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, a int, b text)")
    pair.pub_exec(
        "INSERT INTO t SELECT g, g, 'b' || g FROM generate_series(1, 2000) g;"
        "CREATE PUBLICATION pub FOR ALL TABLES"
    )
    pair.sub_exec("INSERT INTO t SELECT g, g, 'b' || g FROM generate_series(1, 2000) g")
    cfg = pair.write_config(schema={"follow": False})
    _install(cfg)
    runner = Runner(pair, cfg).start().ready()
    statements = [
        "ALTER TABLE t ADD COLUMN c int DEFAULT 1",
        "ALTER TABLE t DROP COLUMN b",
        "ALTER TABLE t ALTER COLUMN a TYPE bigint",
    ]
    with pair.pub_conn() as conn:
        for statement in statements:
            conn.execute(statement.encode())
        conn.execute("INSERT INTO t VALUES (2001, 5000000000, 2)")
    _wait_applied(pair, runner, statements)
    wait_equal(pair, ["t"], runner=runner, order="id")
    assert runner.stop() == 0
    code, report = _verify(cfg, capsys)
    assert (code, report["equal"], report["schema"]) == (0, True, []), report
    # Without the capture (and follow off) a change made only on the source is named.
    done = cli("ddl", "uninstall", "--config", cfg)
    assert done.returncode == 0, done.stderr
    pair.pub_exec("ALTER TABLE t ADD COLUMN d text; ALTER TABLE t ALTER COLUMN c TYPE bigint")
    code, report = _verify(cfg, capsys)
    assert code != 0 and report["equal"] is False, report
    assert [(s["kind"], s["table"], s["name"], s["problem"]) for s in report["schema"]] == [
        ("column", "public.t", "c", "type differs"),
        ("column", "public.t", "d", "missing on the target"),
    ], report["schema"]
