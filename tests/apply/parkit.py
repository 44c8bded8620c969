"""Helpers for the parallel apply tests (issue 36): the pool's config, a change log an
ENABLE ALWAYS trigger writes on the target, writers of independent transactions,
the pool's sessions and metrics.

Exactly once is checked row change by row change: the same trigger runs on both
sides, on the source as an ordinary trigger and on the target made ENABLE ALWAYS
(so the apply sessions, which run with ``session_replication_role = replica``,
fire it), and each side's log table is its own (the publication leaves it out).
Every source change sets ``v`` from a sequence, so each (table, operation, id, v)
is one change: the target's log must hold the source's rows, each once.
"""

from __future__ import annotations

import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import psycopg
from applykit import Runner
from conftest import Pair
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

WORKERS = 4

#: ``changes``: one row per row change of a logged table. ``pid``: the backend that
#: made it (on the target: which apply session), left out of every comparison.
_LOG = """
CREATE TABLE changes (n bigserial PRIMARY KEY, tab text NOT NULL, op text NOT NULL,
                      id int NOT NULL, v bigint, pid int DEFAULT pg_catalog.pg_backend_pid());
CREATE FUNCTION log_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO public.changes (tab, op, id, v) VALUES (TG_TABLE_NAME, TG_OP, OLD.id, OLD.v);
  ELSE
    INSERT INTO public.changes (tab, op, id, v) VALUES (TG_TABLE_NAME, TG_OP, NEW.id, NEW.v);
  END IF;
  PERFORM pg_catalog.pg_sleep({sleep});
  RETURN NULL;
END $$;
"""

_TRIGGER = """
CREATE TRIGGER log_change AFTER INSERT OR UPDATE OR DELETE ON {table}
  FOR EACH ROW EXECUTE FUNCTION public.log_change();
"""


def apply_section(workers: int = WORKERS, **extra: Any) -> dict[str, Any]:
    """``[apply]`` for a pool of ``workers`` sessions that applies every ordinary
    transaction (``adaptive = false``: these tests are about the pool; the lanes'
    own are in test_apply_parallel_lanes.py)."""
    return {"workers": workers, "adaptive": False, "status_interval": 0.5, **extra}


def install_change_log(pair: Pair, tables: list[str], target_sleep: str = "0") -> None:
    """The change log on both sides, its trigger on ``tables``; on the target the
    trigger is ENABLE ALWAYS and sleeps ``target_sleep`` (an SQL expression, seconds)
    a row: a slow target, so a backlog builds and faults meet transactions in flight."""
    for side, sleep in ((pair.pub_exec, "0"), (pair.sub_exec, target_sleep)):
        side(_LOG.replace("{sleep}", sleep))
        for table in tables:
            side(_TRIGGER.replace("{table}", table))
    for table in tables:
        pair.sub_exec(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER log_change")


_CHANGES = "SELECT tab, op, id, v, count(*) FROM changes GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"


def assert_each_change_once(pair: Pair) -> None:
    """The target's log holds exactly the source's row changes, none twice."""
    twice = pair.sub_exec(
        "SELECT tab, op, id, v, count(*) FROM changes GROUP BY 1, 2, 3, 4 HAVING count(*) > 1"
    )
    assert twice == [], f"row changes applied more than once: {twice[:20]}"
    src, dst = pair.pub_exec(_CHANGES), pair.sub_exec(_CHANGES)
    missing = sorted(set(src) - set(dst))
    extra = sorted(set(dst) - set(src))
    assert not missing and not extra, f"missing on target {missing[:20]}, extra {extra[:20]}"
    assert src, "the source logged no change: the test wrote nothing"


def sessions_that_applied(pair: Pair) -> int:
    """How many target backends wrote the change log (> 1: applied in parallel)."""
    return int(pair.sub_exec("SELECT count(DISTINCT pid) FROM changes")[0][0])


def changes_on(side: Callable[[str], list[tuple[Any, ...]]]) -> int:
    return int(side("SELECT count(*) FROM changes")[0][0])


# --- the pool's sessions -------------------------------------------------------


def pool_backends(pair: Pair) -> dict[str, int]:
    """application_name -> pid of the pool's sessions on the target ('applier apply N')."""
    rows = pair.sub.execute(
        "SELECT application_name, pid FROM pg_catalog.pg_stat_activity "
        f"WHERE datname = '{pair.sub_db}' AND application_name ~ '^applier apply [0-9]+$'"
    )
    return {str(r[0]): int(r[1]) for r in rows}


def end_target_backends_at_teardown(pair: Pair) -> None:
    """At teardown, after applier is killed, end its target backends and wait for them,
    and roll back what a failed test left prepared: a backend of a killed client runs on
    until its statement ends (the trigger's sleeps) and holds its origin, and a
    prepared transaction holds the database; the harness could drop neither."""

    def end() -> None:
        query = (
            "SELECT pg_catalog.pg_terminate_backend(pid, 10000) FROM pg_catalog.pg_stat_activity "
            f"WHERE datname = '{pair.sub_db}' AND pid <> pg_catalog.pg_backend_pid()"
        )
        pair.sub.execute(query)
        with pair.sub_conn(autocommit=True) as conn:
            for (gid,) in conn.execute(
                "SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE database = current_database()"
            ).fetchall():
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))

    pair.cleanup.insert(0, end)  # cleanups run last first: this one after every kill


def member_progress(pair: Pair, origin: str) -> dict[str, str]:
    """The origin group's members ('<origin>.<n>') and their remote LSNs."""
    rows = pair.sub.execute(
        "SELECT external_id, remote_lsn::text FROM pg_catalog.pg_replication_origin_status "
        f"WHERE external_id LIKE '{origin}.%' ORDER BY 1"
    )
    return {str(r[0]): str(r[1]) for r in rows}


# --- metrics -------------------------------------------------------------------

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """The ``[metrics] listen`` endpoint's samples; empty while it is not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return {}
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def metric(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 when absent (a counter not yet incremented)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def wait_until(cond: Callable[[], bool], runner: Runner, timeout: float, what: str) -> None:
    """Poll ``cond`` until it holds; fail at once if applier exited, with its log."""
    deadline = time.monotonic() + timeout
    while not cond():
        if not runner.alive():
            raise AssertionError(
                f"applier exited while waiting for {what}:\n{runner.log()[-4000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{runner.log()[-4000:]}")
        time.sleep(0.05)


def in_flight(port: int) -> float:
    return metric(scrape(port), "applier_apply_in_flight_transactions")


# --- writers of independent transactions ----------------------------------------

#: Rows every writer updates now and then: transactions that wait on each other.
HOT = 8

KEYED = """
CREATE TABLE t (id int PRIMARY KEY, v bigint, w text);
CREATE TABLE u (id int PRIMARY KEY, v bigint);
CREATE SEQUENCE vs;
"""


def keyed_schema(pair: Pair, target_sleep: str) -> None:
    """``t`` (logged, its trigger trusted), ``u`` (no trigger: the batching lanes),
    the hot rows of ``t``, and the publication (without the change log)."""
    end_target_backends_at_teardown(pair)
    pair.both(KEYED)
    install_change_log(pair, ["t"], target_sleep)
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t, u")


def insert_hot_rows(pair: Pair) -> None:
    pair.pub_exec(f"INSERT INTO t SELECT g, nextval('vs'), 'hot' FROM generate_series(1, {HOT}) g")


def _keyed_transaction(conn: psycopg.Connection[Any], rng: random.Random, w: int) -> None:
    with conn.transaction():
        if rng.random() < 0.25:  # one hot row: several writers' transactions share it
            conn.execute("UPDATE t SET v = nextval('vs') WHERE id = %s", (rng.randint(1, HOT),))
        for _ in range(rng.randint(1, 4)):
            k = w * 1000 + rng.randint(1, 40)
            op = rng.randrange(6)
            if op in (0, 1):
                conn.execute(
                    "INSERT INTO t VALUES (%s, nextval('vs'), 'i') ON CONFLICT DO NOTHING", (k,)
                )
            elif op == 2:
                conn.execute("UPDATE t SET v = nextval('vs'), w = 'u' WHERE id = %s", (k,))
            elif op == 3:
                conn.execute("DELETE FROM t WHERE id = %s", (k,))
            elif op == 4:  # u: many rows at once, merged and batched on the target
                conn.execute(
                    "INSERT INTO u SELECT g, nextval('vs') "
                    "FROM generate_series(%s::int, %s::int) g "
                    "ON CONFLICT (id) DO UPDATE SET v = excluded.v",
                    (k * 10, k * 10 + 5),
                )
            else:
                conn.execute("DELETE FROM u WHERE id BETWEEN %s AND %s", (k * 10, k * 10 + 2))


def run_keyed_writers(pair: Pair, seed: int, writers: int = 4, txns: int = 60) -> None:
    """``writers`` sessions of ``txns`` transactions each on the source, at once, to the
    end: each on its own keys of ``t`` and ``u`` but for the hot rows."""
    errors: list[BaseException] = []

    def write(w: int) -> None:
        rng = random.Random(seed * 100 + w)
        try:
            with pair.pub_conn() as conn:
                for _ in range(txns):
                    _keyed_transaction(conn, rng, w)
        except BaseException as e:  # the test thread reports it
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(1, writers + 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
