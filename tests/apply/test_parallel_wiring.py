"""Parallel apply's wiring (issue 36) on real servers: what is wired so far.

``run`` reads its restart point from the origin *and* its group at every start
(applier.apply.parallel.origins): after sessions of a group committed, the
plain origin lags, and streaming from it alone would apply the group's
transactions again. An ALWAYS trigger on the target counts every row applied.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from applykit import Runner, wait_equal
from conftest import Pair

from applier.apply.parallel.origins import create_group, member
from applier.apply.target.session import TargetSession
from applier.lsn import Lsn, now_pg_timestamp
from applier.pgconn import connect
from applier.schema import upgrade_target

_COUNTER = """
CREATE TABLE applied (id int NOT NULL);
CREATE FUNCTION count_applied() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO public.applied VALUES (NEW.id); RETURN NEW; END $$;
CREATE TRIGGER count_applied AFTER INSERT OR UPDATE ON t
  FOR EACH ROW EXECUTE FUNCTION count_applied();
ALTER TABLE t ENABLE ALWAYS TRIGGER count_applied;
"""


def _applied_twice(pair: Pair) -> list[tuple[int, int]]:
    rows = pair.sub_exec("SELECT id, count(*) FROM applied GROUP BY id HAVING count(*) > 1")
    return [(int(r[0]), int(r[1])) for r in rows]


def test_run_restarts_from_the_groups_restart_point(pair: Pair) -> None:
    """A group member committed T (its stamp inside COMMIT) after the plain origin's
    last commit: the next ``run`` with one session starts after T, not at it."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.sub_exec(_COUNTER)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 10) g")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0

    # T: on the source, and committed on the target by member 1 of the group.
    pair.pub_exec("INSERT INTO t VALUES (11, 'group')")
    end = Lsn.parse(str(pair.pub_exec("SELECT pg_current_wal_lsn()::text")[0][0]))
    origin = pair.slot  # the default origin
    with connect(pair.sub_dsn, side="target", purpose="applier test") as admin:
        create_group(admin, origin, 2)
    session = TargetSession(pair.sub_dsn, member(origin, 1), "on")
    try:
        session.begin()
        session.execute_sql(b"INSERT INTO public.t VALUES (11, 'group')", "insert")
        session.commit(end, now_pg_timestamp(), lambda local: None, wait=True)
    finally:
        session.close()

    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (12, 'b')")
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    assert _applied_twice(pair) == []
    assert pair.sub_exec("SELECT count(*) FROM applied")[0][0] == 12


def _status(cfg: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "status", "--config", str(cfg), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    out: dict[str, Any] = json.loads(proc.stdout or "{}")
    return out


def _drop(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", "drop", "--config", str(cfg), *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_status_and_drop_read_the_group(pair: Pair) -> None:
    """``status`` shows the restart point (the group's member ahead counts, another
    worker's ``<origin>_2`` does not); ``drop`` removes the group with the origin."""
    pair.pub_exec("CREATE TABLE t (id int primary key); CREATE PUBLICATION pub FOR TABLE t")
    pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput')")
    upgrade_target(pair.sub_dsn)
    cfg = pair.write_config()
    origin = pair.slot
    pair.sub_exec(
        f"SELECT pg_replication_origin_create('{origin}'), "
        f"pg_replication_origin_create('{origin}_2')"
    )
    with connect(pair.sub_dsn, side="target", purpose="applier test") as admin:
        create_group(admin, origin, 2)
    for name, lsn in ((origin, "0/1234ABC"), (member(origin, 2), "0/2000000")):
        pair.sub_exec(f"SELECT pg_replication_origin_advance('{name}', '{lsn}')")
    pair.sub_exec(f"SELECT pg_replication_origin_advance('{origin}_2', '9/0')")
    assert _status(cfg)["origin_progress"]["remote_lsn"] == "0/2000000"

    plan = _drop(cfg, "--origin")
    assert plan.returncode == 0 and "2 parallel sessions' origins" in plan.stdout, plan.stderr
    # A session of a parallel run holding its member: refused, nothing removed.
    with connect(pair.sub_dsn, side="target", purpose="applier test") as session:
        session.execute("SELECT pg_replication_origin_session_setup(%s)", (member(origin, 1),))
        refused = _drop(cfg, "--origin", "--yes")
        assert refused.returncode == 1 and member(origin, 1) in refused.stderr, refused.stderr
        session.execute("SELECT pg_replication_origin_session_reset()")
    assert len(pair.sub_exec(f"SELECT 1 FROM pg_replication_origin WHERE roname = '{origin}'")) == 1
    done = _drop(cfg, "--origin", "--yes")
    assert done.returncode == 0, done.stderr
    left = {r[0] for r in pair.sub_exec("SELECT roname FROM pg_replication_origin")}
    assert left & {origin, member(origin, 1), member(origin, 2)} == set()
    assert f"{origin}_2" in left  # another worker's
