"""One copy task on its own: the psql child's argv, snapshot errors, retries."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import ONE_PAIR, Pair
from psycopg.conninfo import conninfo_to_dict

from applier.bootstrap.copy_task import SliceTask, copy_slice, source_command
from applier.errors import BootstrapError
from applier.schema import upgrade_target

SECRET = "pw-never-in-argv-7f3a"


def _task(source: str, target: str, snapshot: str, *, where: str | None = None) -> SliceTask:
    return SliceTask(
        source_conninfo=source,
        target_conninfo=target,
        snapshot=snapshot,
        slot="s",
        run_id=1,
        src_schema="public",
        src_name="t",
        dst_schema="public",
        dst_name="t",
        columns=("id", "v"),
        binary=True,
        slice_no=0,
        where=where,
    )


def test_source_argv_has_the_whole_dsn_but_never_a_secret() -> None:
    dsn = (
        f"host=db.example port=5433 user=u password={SECRET} dbname=d sslmode=verify-full "
        "channel_binding=require require_auth=scram-sha-256 ssl_min_protocol_version=TLSv1.3 "
        "options='-c work_mem=64MB'"
    )
    with source_command(_task(dsn, "", "0-1-2")) as (argv, env):
        assert not any(SECRET in a for a in argv)
        assert env["PGPASSWORD"] == SECRET
        psql = next(i for i, a in enumerate(argv) if a.endswith("psql"))
        assert argv[psql + 1 : psql + 5] == ["-X", "-q", "-v", "ON_ERROR_STOP=1"]
        assert "SET TRANSACTION SNAPSHOT '0-1-2'" in argv
        dbname = argv[psql + 5].removeprefix("--dbname=")
    params = conninfo_to_dict(dbname)
    assert "password" not in params
    for key, value in [("host", "db.example"), ("port", "5433"), ("user", "u"), ("dbname", "d"),
                       ("sslmode", "verify-full"), ("channel_binding", "require"),
                       ("require_auth", "scram-sha-256"), ("ssl_min_protocol_version", "TLSv1.3"),
                       ("client_encoding", "UTF8")]:  # fmt: skip
        assert params[key] == value, key
    # The user's options stay; the formats and timeouts are pinned after them.
    assert str(params["options"]).startswith("-c work_mem=64MB -c datestyle=ISO")
    assert "-c statement_timeout=0" in str(params["options"])


def test_sslpassword_only_in_a_private_file_while_the_child_starts() -> None:
    dsn = f"host=h user=u sslpassword={SECRET} sslkey=/k.key"
    with source_command(_task(dsn, "", "0-1-2")) as (argv, env):
        assert not any(SECRET in a for a in argv) and SECRET not in str(env.get("PGPASSWORD"))
        service = Path(env["PGSERVICEFILE"])
        assert service.stat().st_mode & 0o777 == 0o600
        assert f"sslpassword={SECRET}" in service.read_text()
    assert not service.exists()


@pytest.fixture
def tables(pair: Pair) -> Iterator[Pair]:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("INSERT INTO t SELECT g, repeat('x', g % 50) FROM generate_series(1, 5000) g")
    upgrade_target(pair.sub_dsn)
    yield pair


@pytest.fixture
def snapshot(tables: Pair) -> Iterator[str]:
    with tables.pub_conn() as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        snap = conn.execute("SELECT pg_export_snapshot()").fetchone()
        assert snap is not None
        # Rows committed after the export are not copied.
        with tables.pub_conn(autocommit=True) as other:
            other.execute("INSERT INTO t VALUES (9999, 'late')")
        yield str(snap[0])


@ONE_PAIR
def test_copy_is_under_the_snapshot_password_only_in_env_and_retry_skips(
    tables: Pair, snapshot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[bytes, bytes]] = []
    real_popen = subprocess.Popen

    def spy(*args: Any, **kw: Any) -> Any:
        proc = real_popen(*args, **kw)
        # Popen may return while exec is still setting up the new image
        # (vfork): wait for psql's own argv to show.
        pid = Path(f"/proc/{proc.pid}")
        deadline = time.monotonic() + 2
        while not (cmdline := (pid / "cmdline").read_bytes()) and time.monotonic() < deadline:
            time.sleep(0.005)
        seen.append((cmdline, (pid / "environ").read_bytes()))
        return proc

    monkeypatch.setattr(subprocess, "Popen", spy)  # copy_task calls subprocess.Popen
    # The sleep keeps psql alive while /proc is read (a zombie has no cmdline).
    slow = "(SELECT true FROM pg_sleep(0.5))"
    task = _task(f"{tables.pub_dsn} password={SECRET}", tables.sub_dsn, snapshot, where=slow)
    res = copy_slice(task)
    assert (res.rows, res.skipped) == (5000, False) and res.bytes > 0
    assert len(seen) == 1
    cmdline, environ = seen[0]
    assert b"psql" in cmdline and SECRET.encode() not in cmdline
    assert f"PGPASSWORD={SECRET}".encode() in environ.split(b"\0")
    assert tables.sub_exec("SELECT count(*), max(id) FROM t") == [(5000, 5000)]
    # A retry of the finished slice copies nothing and starts no child.
    assert copy_slice(task).skipped
    assert len(seen) == 1
    assert tables.sub_exec("SELECT count(*) FROM t") == [(5000,)]


@ONE_PAIR
def test_gone_snapshot_is_one_clear_error_and_leaves_nothing(tables: Pair) -> None:
    task = _task(tables.pub_dsn, tables.sub_dsn, "00000003-0000001B-1")
    with pytest.raises(BootstrapError, match=r"exported snapshot 00000003-0000001B-1 is gone"):
        copy_slice(task)
    assert tables.sub_exec("SELECT count(*) FROM t") == [(0,)]
    assert tables.sub_exec("SELECT count(*) FROM applier.bootstrap_slice") == [(0,)]


@ONE_PAIR
def test_source_error_aborts_the_target_transaction(tables: Pair, snapshot: str) -> None:
    # The error comes after some rows went out: the target must not keep them.
    task = _task(tables.pub_dsn, tables.sub_dsn, snapshot, where="1 / (4000 - id) >= 0")
    with pytest.raises(BootstrapError, match=r"slice public\.t#0 failed on the source: division"):
        copy_slice(task)
    assert tables.sub_exec("SELECT count(*) FROM t") == [(0,)]
    assert tables.sub_exec("SELECT count(*) FROM applier.bootstrap_slice") == [(0,)]


@ONE_PAIR
def test_target_error_names_the_slice(tables: Pair, snapshot: str) -> None:
    tables.sub_exec("ALTER TABLE t ADD CHECK (id < 100)")
    with pytest.raises(BootstrapError, match=r"slice public\.t#0 failed: .*check constraint"):
        copy_slice(_task(tables.pub_dsn, tables.sub_dsn, snapshot))
    assert tables.sub_exec("SELECT count(*) FROM t") == [(0,)]
    with psycopg.connect(tables.sub_dsn) as conn:  # no copy left running on the target
        n = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'applier-bootstrap'"
        ).fetchone()
    assert n == (0,)
