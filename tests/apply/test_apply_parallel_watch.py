"""Parallel apply, watched: what status and the metrics say of the pool, and what it serialises.

One pair: nothing here depends on the server versions (the pool's own tests on
several pairs are in test_apply_parallel*.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from applykit import Runner, wait_equal, wait_for
from conftest import Pair
from metrics.test_metrics import free_port, get, scrape


def _status(cfg: str) -> tuple[dict[str, object], str]:
    run = [sys.executable, "-m", "applier.cli", "status", "--config", cfg]
    js = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=60)
    text = subprocess.run(run, capture_output=True, text=True, timeout=60, env=None)
    return json.loads(js.stdout or "{}"), text.stdout


@pytest.mark.parametrize("pair", ["18-18"], indirect=True)
def test_the_pool_shows_what_it_serialised(pair: Pair) -> None:
    """Independent transactions run beside each other; ones sharing a key wait for the
    earlier one (counted by key); TRUNCATE and a table whose target fires an untrusted
    trigger are barriers (counted by barrier); status and the metrics show the pool."""
    pair.both(
        "CREATE TABLE t (id int PRIMARY KEY, n int);"
        "CREATE TABLE h (id int PRIMARY KEY, v text);"
        "CREATE TABLE w (id int PRIMARY KEY, n int)"
    )
    # On the target only: a trigger nobody said may run beside others.
    pair.sub_exec(
        "CREATE TABLE w_log (id int, at timestamptz DEFAULT now());"
        "CREATE FUNCTION w_log() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN INSERT INTO public.w_log (id) VALUES (NEW.id); RETURN NEW; END $$;"
        "CREATE TRIGGER w_log AFTER INSERT OR UPDATE ON w FOR EACH ROW EXECUTE FUNCTION w_log();"
        "ALTER TABLE w ENABLE ALWAYS TRIGGER w_log"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    port = free_port()
    cfg = pair.write_config(
        apply={"workers": 4, "adaptive": False}, metrics={"listen": f"127.0.0.1:{port}"}
    )
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t SELECT g, 0 FROM generate_series(1, 100) g")
    with pair.pub_conn() as conn:
        for i in range(1, 101):
            conn.execute("UPDATE t SET n = n + 1 WHERE id = %s", (i,))  # independent
        for _ in range(30):
            conn.execute("UPDATE t SET n = n + 1 WHERE id = 1")  # one key: each waits
        conn.execute("INSERT INTO h VALUES (1, 'a')")
        conn.execute("TRUNCATE h")
        for i in range(1, 6):
            conn.execute("INSERT INTO w VALUES (%s, 0)", (i,))
    wait_equal(pair, ["t", "h", "w"], runner=runner)
    assert pair.sub_exec("SELECT count(*) FROM w_log")[0][0] == 5  # fired once per row

    def scraped() -> bool:
        s = scrape(port)
        return get(s, "applier_apply_in_flight_transactions") == 0

    wait_for(scraped, what="nothing in flight")
    s = scrape(port)
    assert get(s, "applier_apply_sessions") == 4
    assert (get(s, "applier_apply_serialised_total", reason="key") or 0) >= 20
    # TRUNCATE, the watched table's 5 transactions, and the first of each table.
    assert (get(s, "applier_apply_serialised_total", reason="barrier") or 0) >= 7
    assert get(s, "applier_apply_deadlocks_total") == 0
    origins = pair.sub_exec(
        f"SELECT roname FROM pg_replication_origin WHERE roname LIKE '{pair.slot}.%' ORDER BY 1"
    )
    assert [r[0] for r in origins] == [f"{pair.slot}.{i}" for i in range(1, 5)]

    def beat() -> bool:
        st, _ = _status(str(cfg))
        par = (st.get("worker") or {}).get("parallel")  # type: ignore[attr-defined]
        return bool(par) and par["sessions"] == 4 and par["serialised_by_key"] >= 20

    wait_for(beat, timeout=30, what="the heartbeat carries the pool")  # status_interval
    st, text = _status(str(cfg))
    assert "parallel apply" in text and "4 sessions" in text, text
    # The origin progress shown is the group's: the end of the last transaction applied.
    last = pair.sub_exec(
        "SELECT max(pg_replication_origin_progress(roname, false))::text "
        f"FROM pg_replication_origin WHERE roname LIKE '{pair.slot}%'"
    )[0][0]
    assert st["origin_progress"]["remote_lsn"] == last  # type: ignore[index]
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["18-18"], indirect=True)
def test_a_refusal_beside_earlier_transactions_is_applied_again(pair: Pair) -> None:
    """What the keys cannot see: a trusted target trigger that keeps a unique list of
    names in a table of its own. T1 deletes the row named 'x' (its trigger sleeps 1 s
    first), T2 inserts another row named 'x': run beside T1, T2's trigger meets the
    'x' T1 has not removed yet (a unique violation); the member rolls T2 back, waits
    for T1's commit and applies it again, and nothing stops."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, name text)")
    pair.sub_exec(
        "CREATE TABLE names (name text UNIQUE);"
        "CREATE FUNCTION names() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF TG_OP = 'DELETE' THEN "
        "  IF OLD.id = 1 THEN PERFORM pg_sleep(1); END IF;"
        "  DELETE FROM public.names WHERE name = OLD.name; RETURN OLD; END IF;"
        "INSERT INTO public.names VALUES (NEW.name); RETURN NEW; END $$;"
        "CREATE TRIGGER names AFTER INSERT OR DELETE ON t FOR EACH ROW EXECUTE FUNCTION names();"
        "ALTER TABLE t ENABLE ALWAYS TRIGGER names"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    port = free_port()
    cfg = pair.write_config(
        apply={"workers": 4, "adaptive": False, "trusted_triggers": ["public.t"]},
        metrics={"listen": f"127.0.0.1:{port}"},
    )
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1, 'x'), (3, 'y')")
    wait_equal(pair, ["t"], runner=runner)
    pair.pub_exec("DELETE FROM t WHERE id = 1")
    pair.pub_exec("INSERT INTO t VALUES (2, 'x')")
    wait_equal(pair, ["t"], runner=runner)
    assert pair.sub_exec("SELECT name FROM names ORDER BY 1") == [("x",), ("y",)]
    assert (get(scrape(port), "applier_apply_retried_total") or 0) >= 1
    assert "applying transactions again" in runner.log()
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["18-18"], indirect=True)
def test_sessions_beyond_the_targets_origin_states_are_refused(pair: Pair) -> None:
    """Each session's origin takes a slot of the target's replication state (from 18
    max_active_replication_origins, before max_replication_slots), held or not: more
    sessions than it has room for is one line naming the setting, exit 2, before any
    origin of the group is created."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    # Leave room for three: the worker's own origin and two sessions.
    pair.sub_exec(
        f"SELECT pg_replication_origin_create('fill_{pair.pub_db}_' || g), "
        f"pg_replication_origin_advance('fill_{pair.pub_db}_' || g, '0/1') "
        "FROM generate_series(1, current_setting('max_active_replication_origins')::int "
        "- (SELECT count(*) FROM pg_replication_origin_status)::int - 3) g"
    )
    cfg = pair.write_config(apply={"workers": 4})
    done = subprocess.run(
        [sys.executable, "-m", "applier.cli", "run", "--config", str(cfg)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "max_active_replication_origins" in last and "workers = 4" in last, last
    assert pair.sub_exec(
        f"SELECT count(*) FROM pg_replication_origin WHERE roname LIKE '{pair.slot}.%'"
    ) == [(0,)]


@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_fewer_sessions_drop_the_members_beyond_them(pair: Pair) -> None:
    """After a run with 4 sessions and one with 2 that applied more, a start with 2
    drops members 3 and 4 (below the restart point: nothing of it is lost); the
    stream goes on exactly once."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, n int)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    logs = ""
    for n, (workers, rows) in enumerate(((4, range(1, 41)), (2, range(41, 81)), (2, [81]))):
        cfg = pair.write_config(apply={"workers": workers})
        runner = Runner(pair, cfg, log_name=f"applier-{n}.log").start().ready()
        for i in rows:
            pair.pub_exec(f"INSERT INTO t VALUES ({i}, {i})")
        wait_equal(pair, ["t"], runner=runner)
        assert runner.stop() == 0
        logs += runner.log()
    members = pair.sub_exec(
        f"SELECT roname FROM pg_replication_origin WHERE roname LIKE '{pair.slot}.%' ORDER BY 1"
    )
    assert [m[0] for m in members] == [f"{pair.slot}.1", f"{pair.slot}.2"]
    assert "origins of sessions beyond [apply] workers dropped" in logs
