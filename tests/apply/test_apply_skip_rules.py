"""Skip rules in a running worker: objects, one transaction, failing changes; kept changes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from applykit import ROOT, Runner, table_rows, wait_for
from conftest import ONE_PAIR, TWO_SOURCES, Pair


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def _skip_add(cfg: Path, *args: str) -> int:
    done = _cli("skip", "add", "--config", str(cfg), *args)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def _ids(pair: Pair, table: str) -> list[int]:
    return sorted(json.loads(r)["id"] for r in table_rows(pair.sub_exec, table))


def _kept(pair: Pair) -> list[tuple[Any, ...]]:
    return pair.sub_exec(
        "SELECT rule_id, xid, table_name, op, skipped, key::text, new_row::text, sqlstate "
        "FROM applier.skipped_changes ORDER BY id"
    )


def _slot(pair: Pair, cfg: Path) -> None:
    assert Runner(pair, cfg, "slot.log").start().ready().stop() == 0


@ONE_PAIR
def test_object_txn_and_error_rules(pair: Pair) -> None:
    pair.both(
        "CREATE TABLE tmp_a (id int PRIMARY KEY, v text); CREATE TABLE t (id int PRIMARY KEY)"
    )
    pair.pub_exec("CREATE TABLE c (id int PRIMARY KEY, n int)")
    pair.sub_exec("CREATE TABLE c (id int PRIMARY KEY, n int CHECK (n >= 0))")  # target only
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    _slot(pair, cfg)
    obj = _skip_add(cfg, "--table", "public.tmp_*", "--op", "insert")
    err = _skip_add(cfg, "--error", "--table", "public.c", "--sqlstate", "23514")
    pair.pub_exec("INSERT INTO tmp_a VALUES (1, 'x')")
    pair.pub_exec("BEGIN; INSERT INTO t VALUES (1); INSERT INTO t VALUES (2); COMMIT")
    pair.pub_exec("INSERT INTO t VALUES (3)")
    pair.pub_exec("BEGIN; INSERT INTO c VALUES (1, 1), (2, -2), (3, 3); COMMIT")
    pair.pub_exec("INSERT INTO c VALUES (4, 4)")
    xid = int(pair.pub_exec("SELECT max(xmin::text::bigint) FROM t WHERE id = 1")[0][0])
    txn = _skip_add(cfg, "--xid", str(xid))
    runner = Runner(pair, cfg).start().ready()
    wait_for(lambda: _ids(pair, "c") == [1, 3, 4] and _ids(pair, "t") == [3], 60, "the rules")
    pair.pub_exec("UPDATE tmp_a SET v = 'y'")  # an update is not skipped: row 1 is missing
    pair.pub_exec("INSERT INTO t VALUES (4)")
    wait_for(lambda: _ids(pair, "t") == [3, 4], 60)
    assert runner.stop() == 0
    assert _ids(pair, "tmp_a") == []
    kept = _kept(pair)
    assert [(k[0], k[2], k[3], k[4]) for k in kept] == [
        (obj, "tmp_a", "insert", True),
        (txn, "t", "insert", True),
        (txn, "t", "insert", True),
        (err, "c", "insert", True),
    ], kept
    assert kept[1][1] == xid and json.loads(kept[3][6]) == {"id": "2", "n": "-2"}
    assert kept[3][7] == "23514"
    rules = json.loads(_cli("skip", "list", "--config", str(cfg), "--json").stdout)
    assert {r["id"]: r["done"] for r in rules} == {obj: False, err: False, txn: True}
    missing = pair.sub_exec("SELECT conflict FROM applier.conflict_log")
    assert missing == [("update_missing",)]


@ONE_PAIR
def test_rule_added_while_running_takes_effect(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE marker (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1)")
    wait_for(lambda: _ids(pair, "t") == [1], 30)
    _skip_add(cfg, "--table", "public.t", "--dump", "none")
    # The worker rereads its rules every few seconds and logs when they changed
    # (an empty set at start logs nothing): from then on the rule is in force.
    wait_for(lambda: "skip rules loaded" in runner.log(), 30, "the worker to load the rule")
    pair.pub_exec("INSERT INTO t VALUES (2)")
    # Applied in commit order: once the marker is there, row 2 was seen (and skipped).
    pair.pub_exec("INSERT INTO marker VALUES (1)")
    wait_for(lambda: _ids(pair, "marker") == [1], 30, "the marker")
    assert runner.alive()
    assert _ids(pair, "t") == [1]
    assert _kept(pair) == []  # --dump none
    assert runner.stop() == 0


@TWO_SOURCES
def test_skip_the_transaction_the_worker_stopped_on(any_pair: Pair) -> None:
    """The error prints the command; running it skips exactly that transaction, which is
    kept in the dump; everything after it is applied."""
    pair = any_pair
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    _slot(pair, cfg)
    pair.sub_exec("INSERT INTO t VALUES (2, 'local')")
    pair.pub_exec("INSERT INTO t VALUES (1, 'a')")
    pair.pub_exec("BEGIN; INSERT INTO t VALUES (5, 'e'); INSERT INTO t VALUES (2, 'b'); COMMIT")
    pair.pub_exec("INSERT INTO t VALUES (3, 'c')")
    runner = Runner(pair, cfg).start()
    assert runner.wait(90) == 3
    m = re.search(r"(applier skip add --config \S+ --lsn [0-9A-F]+/[0-9A-F]+)", runner.log())
    assert m, runner.log()[-3000:]
    status = _cli("status", "--config", str(cfg))
    assert m.group(1) in status.stdout, status.stdout
    args = m.group(1).split()[1:]
    done = _cli(*args)
    assert done.returncode == 0, done.stderr
    runner = Runner(pair, cfg, "after.log").start().ready()
    wait_for(lambda: _ids(pair, "t") == [1, 2, 3], 60, "the transactions after it")
    assert runner.stop() == 0
    kept = _kept(pair)
    assert [(k[2], k[3], k[4], json.loads(k[5])) for k in kept] == [
        ("t", "insert", True, {"id": "5"}),
        ("t", "insert", True, {"id": "2"}),
    ]
    assert pair.sub_exec("SELECT v FROM t WHERE id = 2") == [("local",)]
    dump = _cli("skip", "dump", "--config", str(cfg))
    assert dump.returncode == 0 and "INSERT INTO" in dump.stdout and "'e'" in dump.stdout
