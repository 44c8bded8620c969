"""Conflicts: detected and named, resolved by [conflicts] policies, recorded once."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from applykit import Runner, table_rows, wait_for
from conftest import ONE_PAIR, TWO_SOURCES, Pair


def _config(pair: Pair, conflicts: str, **sections: Any) -> Path:
    path = pair.write_config(**sections)
    path.write_text(path.read_text() + "\n[conflicts]\n" + conflicts)
    return path


def _slot(pair: Pair, cfg: Path) -> None:
    """Create the slot (the worker does at its first start): what follows is a backlog."""
    assert Runner(pair, cfg, "slot.log").start().ready().stop() == 0


def _log(pair: Pair) -> list[tuple[Any, ...]]:
    return pair.sub_exec(
        "SELECT table_name, conflict, resolution, key::text, local_row::text, remote_row::text, "
        "xid, commit_lsn::text FROM applier.conflict_log ORDER BY id"
    )


def _rows(pair: Pair, table: str) -> list[Any]:
    return sorted((json.loads(r) for r in table_rows(pair.sub_exec, table)), key=lambda r: r["id"])


@pytest.mark.parametrize("any_pair", ["15-15", "15-18", "18-18", "14-18", "17-18"], indirect=True)
def test_default_policies_skip_missing_rows_and_stop_on_insert_exists(any_pair: Pair) -> None:
    """update/delete_missing are skipped and logged; insert_exists stops the worker with the
    conflict named and the command that skips its transaction; restarts record it once."""
    pair = any_pair
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.pub_exec("INSERT INTO t VALUES (1, 'a'), (4, 'd')")  # before the slot: not on target
    cfg = _config(pair, "")
    _slot(pair, cfg)
    pair.sub_exec("INSERT INTO t VALUES (2, 'local')")
    pair.pub_exec("UPDATE t SET v = 'b' WHERE id = 1")  # update_missing
    pair.pub_exec("DELETE FROM t WHERE id = 4")  # delete_missing
    bad_xid = pair.pub_exec("INSERT INTO t VALUES (2, 'remote') RETURNING txid_current()")[0][0]
    pair.pub_exec("INSERT INTO t VALUES (3, 'c')")
    for attempt in range(2):
        runner = Runner(pair, cfg, f"run{attempt}.log").start()
        assert runner.wait(90) == 3
        out = runner.log()
        assert "conflict insert_exists" in out, out[-3000:]
        m = re.search(r"applier skip add --config (\S+) --lsn ([0-9A-F]+/[0-9A-F]+)", out)
        assert m and m.group(1) == str(cfg), out[-3000:]
        log = _log(pair)
        assert [(r[1], r[2]) for r in log] == [
            ("update_missing", "skip"),
            ("delete_missing", "skip"),
            ("insert_exists", "error"),
        ], log
        assert log[2][6] == bad_xid % 2**32 and log[2][7] == m.group(2)
        assert json.loads(log[2][4]) == {"id": 2, "v": "local"}
        assert json.loads(log[2][5]) == {"id": "2", "v": "remote"}
        assert json.loads(log[0][3]) == {"id": "1"}
    pair.sub_exec("DELETE FROM t WHERE id = 2")
    runner = Runner(pair, cfg, "run-fixed.log").start().ready()
    wait_for(lambda: len(_rows(pair, "t")) == 2, 60, "the rest to be applied")
    assert _rows(pair, "t") == [{"id": 2, "v": "remote"}, {"id": 3, "v": "c"}]
    assert len(_log(pair)) == 3  # nothing recorded twice
    assert runner.stop() == 0


@TWO_SOURCES
def test_policies_by_table_pattern(any_pair: Pair) -> None:
    """keep_local by pattern (also for a run long enough for COPY), apply_remote for
    insert_exists and update_missing; grouped transactions; one record per conflict."""
    pair = any_pair
    pair.both(
        "CREATE TABLE audit_a (id int PRIMARY KEY, v text);"
        "CREATE TABLE orders (id int PRIMARY KEY, v text, n int);"
        "CREATE TABLE plain (id int PRIMARY KEY)"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.pub_exec("INSERT INTO orders VALUES (5, 'five', 5)")  # not on the target
    cfg = _config(
        pair,
        'default = { insert_exists = "error" }\n'
        '"public.audit_*" = { insert_exists = "keep_local" }\n'
        '"public.*" = { insert_exists = "skip" }\n'
        '"public.orders" = { insert_exists = "apply_remote", update_missing = "apply_remote" }\n',
    )
    _slot(pair, cfg)
    pair.sub_exec(
        "INSERT INTO audit_a VALUES (1, 'local'), (700, 'local'), (1499, 'local');"
        "INSERT INTO orders VALUES (1, 'l', 0)"
    )
    pair.pub_exec(
        "BEGIN; INSERT INTO audit_a SELECT g, 'remote' FROM generate_series(1, 1500) g; COMMIT;"
        + "".join(f"INSERT INTO plain VALUES ({i});" for i in range(50))
        + "INSERT INTO orders VALUES (1, 'remote', 1), (2, 'r2', 2);"
        "UPDATE orders SET v = 'upd', n = 50 WHERE id = 5;"
        "UPDATE orders SET n = 51 WHERE id = 5;"
    )
    runner = Runner(pair, cfg).start().ready()
    wait_for(lambda: len(_rows(pair, "plain")) == 50 and len(_rows(pair, "orders")) == 3, 60)
    assert runner.stop() == 0
    audit = _rows(pair, "audit_a")
    assert len(audit) == 1500
    assert [r["id"] for r in audit if r["v"] == "local"] == [1, 700, 1499]
    assert _rows(pair, "orders") == [
        {"id": 1, "v": "remote", "n": 1},
        {"id": 2, "v": "r2", "n": 2},
        {"id": 5, "v": "upd", "n": 51},
    ]
    log = _log(pair)
    assert sorted((r[0], r[1], r[2]) for r in log) == [
        ("audit_a", "insert_exists", "keep_local"),
        ("audit_a", "insert_exists", "keep_local"),
        ("audit_a", "insert_exists", "keep_local"),
        ("orders", "insert_exists", "apply_remote"),
        ("orders", "update_missing", "apply_remote"),
    ], log
    audit_recs = sorted(
        ((json.loads(r[4]), json.loads(r[5])) for r in log if r[0] == "audit_a"),
        key=lambda rec: rec[0]["id"],
    )
    assert audit_recs[0] == ({"id": 1, "v": "local"}, {"id": "1", "v": "remote"})
    assert [loc["id"] for loc, _ in audit_recs] == [1, 700, 1499]


@ONE_PAIR
def test_update_exists_skip_keeps_the_rest_of_the_transaction(pair: Pair) -> None:
    """An UPDATE whose new row takes a unique key a target-only row holds: with
    update_exists = skip, only that change is skipped (careful replay), once."""
    pair.pub_exec("CREATE TABLE t (id int PRIMARY KEY, u int)")
    pair.sub_exec("CREATE TABLE t (id int PRIMARY KEY, u int UNIQUE)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = _config(pair, 'default = { update_exists = "skip" }\n')
    _slot(pair, cfg)
    pair.sub_exec("INSERT INTO t VALUES (100, 5)")
    pair.pub_exec(
        "INSERT INTO t VALUES (1, 1);"
        "BEGIN; INSERT INTO t VALUES (6, 6); UPDATE t SET u = 5 WHERE id = 1; "
        "INSERT INTO t VALUES (7, 7); COMMIT;"
        "INSERT INTO t VALUES (8, 8);"
    )
    runner = Runner(pair, cfg).start().ready()
    wait_for(lambda: len(_rows(pair, "t")) == 5, 60, "the rows after the conflict")
    assert runner.stop() == 0
    assert _rows(pair, "t") == [
        {"id": 1, "u": 1},
        {"id": 6, "u": 6},
        {"id": 7, "u": 7},
        {"id": 8, "u": 8},
        {"id": 100, "u": 5},
    ]
    log = _log(pair)
    assert [(r[1], r[2]) for r in log] == [("update_exists", "skip")], log
    assert json.loads(log[0][4]) == {"id": 100, "u": 5}
    assert "replaying with a savepoint per change" in runner.log()


def test_origin_differs_and_last_update_wins(make_pair: Any) -> None:
    """With track_commit_timestamp on the target: a row last written locally is an
    origin conflict (keep_local / apply_remote as configured); last_update_wins compares
    the local row's commit time with the source's."""
    pair = make_pair(15, 15, sub_settings={"track_commit_timestamp": "on"})
    pair.both(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE lww (id int PRIMARY KEY, v text)"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = _config(
        pair,
        'default = { update_origin_differs = "keep_local", '
        'delete_origin_differs = "apply_remote" }\n'
        '"public.lww" = { insert_exists = "last_update_wins" }\n',
    )
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    wait_for(lambda: len(_rows(pair, "t")) == 3, 60)
    assert runner.stop() == 0
    pair.sub_exec("UPDATE t SET v = 'local' WHERE id IN (2, 3)")
    pair.pub_exec("UPDATE t SET v = v || '2'")
    pair.pub_exec("DELETE FROM t WHERE id = 3")
    pair.sub_exec("INSERT INTO lww VALUES (2, 'local-old')")
    time.sleep(0.05)
    pair.pub_exec("INSERT INTO lww VALUES (1, 'remote-old')")
    time.sleep(0.05)
    pair.sub_exec("INSERT INTO lww VALUES (1, 'local-new')")
    time.sleep(0.05)
    pair.pub_exec("INSERT INTO lww VALUES (2, 'remote-new')")
    runner = Runner(pair, cfg, "run2.log").start().ready()
    wait_for(lambda: len(_log(pair)) == 5, 60, "five conflicts")
    assert runner.stop() == 0
    assert _rows(pair, "t") == [{"id": 1, "v": "a2"}, {"id": 2, "v": "local"}]
    assert _rows(pair, "lww") == [{"id": 1, "v": "local-new"}, {"id": 2, "v": "remote-new"}]
    log = sorted((r[0], r[1], r[2]) for r in _log(pair))
    assert log == [
        ("lww", "insert_exists", "last_update_wins"),
        ("lww", "insert_exists", "last_update_wins"),
        ("t", "delete_origin_differs", "apply_remote"),
        ("t", "update_origin_differs", "keep_local"),
        ("t", "update_origin_differs", "keep_local"),
    ], log


@ONE_PAIR
def test_commit_timestamps_required(pair: Pair) -> None:
    """A policy that needs commit timestamps on a target without them: exit 2, what to do."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = _config(pair, 'default = { update_origin_differs = "keep_local" }\n')
    runner = Runner(pair, cfg).start()
    assert runner.wait(60) == 2
    assert "track_commit_timestamp" in runner.log()


@ONE_PAIR
def test_update_missing_error_policy_names_the_skip(pair: Pair) -> None:
    """A policy of error for a conflict seen in a result (not a failed statement): the
    worker stops with the conflict and the skip command, recorded once; skipping works."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.pub_exec("INSERT INTO t VALUES (1, 'a')")  # before the slot: not on the target
    cfg = _config(pair, 'default = { update_missing = "error" }\n')
    _slot(pair, cfg)
    pair.pub_exec("INSERT INTO t VALUES (2, 'b')")
    pair.pub_exec("UPDATE t SET v = 'x' WHERE id = 1")
    pair.pub_exec("INSERT INTO t VALUES (3, 'c')")
    runner = Runner(pair, cfg).start()
    assert runner.wait(90) == 3
    out = runner.log()
    m = re.search(r"applier skip add --config \S+ --lsn ([0-9A-F]+/[0-9A-F]+)", out)
    assert "conflict update_missing" in out and m, out[-3000:]
    assert [(r[1], r[2], r[7]) for r in _log(pair)] == [("update_missing", "error", m.group(1))]
    assert _rows(pair, "t") == [{"id": 2, "v": "b"}]
    pair.sub_exec(
        "INSERT INTO applier.skip_rules (origin, kind, lsn, dump) "
        f"VALUES ('{pair.slot}', 'txn', '{m.group(1)}', 'all')"
    )
    runner = Runner(pair, cfg, "run2.log").start().ready()
    wait_for(lambda: len(_rows(pair, "t")) == 2, 60)
    assert runner.stop() == 0
    assert _rows(pair, "t") == [{"id": 2, "v": "b"}, {"id": 3, "v": "c"}]
    assert len(_log(pair)) == 1


def _recs(pair: Pair) -> list[tuple[Any, ...]]:
    """The conflict log as (table, type, policy, key, local row), sorted."""
    recs = [
        (r[0], r[1], r[2], json.loads(r[3]), None if r[4] is None else json.loads(r[4]))
        for r in _log(pair)
    ]
    return sorted(recs, key=lambda r: (r[0], r[1], r[2], json.dumps(r[3], sort_keys=True)))


@ONE_PAIR
def test_full_identity_with_a_primary_key_resolves_inserts_by_any_unique_key(pair: Pair) -> None:
    """REPLICA IDENTITY FULL beside a primary key and a unique key: an INSERT's conflict is
    met on whichever unique index holds its key; apply_remote updates that row, keep_local
    and skip keep it (runs of rows too, some with NULLs that are no conflict)."""
    for t in ("ar", "kl", "sk"):
        pair.both(
            f"CREATE TABLE {t} (id int PRIMARY KEY, v text, u int UNIQUE);"
            f"ALTER TABLE {t} REPLICA IDENTITY FULL"
        )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = _config(
        pair,
        '"public.ar" = { insert_exists = "apply_remote" }\n'
        '"public.kl" = { insert_exists = "keep_local" }\n'
        '"public.sk" = { insert_exists = "skip" }\n',
    )
    _slot(pair, cfg)
    for t in ("ar", "kl", "sk"):
        pair.sub_exec(f"INSERT INTO {t} VALUES (1, 'local', 10), (9, 'nine', 50)")
        pair.pub_exec(
            f"BEGIN; INSERT INTO {t} VALUES (1, 'remote', 11), (2, NULL, NULL), (3, 'r3', NULL),"
            f" (4, 'r4', 40); INSERT INTO {t} VALUES (5, 'five', 50); COMMIT"
        )
    runner = Runner(pair, cfg).start().ready()
    wait_for(lambda: len(_log(pair)) == 6, 60, "six conflicts")
    wait_for(lambda: all(len(_rows(pair, t)) == 5 for t in ("ar", "kl", "sk")), 60)
    assert runner.stop() == 0
    rest = [
        {"id": 2, "v": None, "u": None},
        {"id": 3, "v": "r3", "u": None},
        {"id": 4, "v": "r4", "u": 40},
    ]
    assert _rows(pair, "ar") == [
        {"id": 1, "v": "remote", "u": 11},
        *rest,
        {"id": 5, "v": "five", "u": 50},
    ]
    for t in ("kl", "sk"):
        assert _rows(pair, t) == [
            {"id": 1, "v": "local", "u": 10},
            *rest,
            {"id": 9, "v": "nine", "u": 50},
        ], t
    one = {"id": "1", "v": "remote", "u": "11"}
    five = {"id": "5", "v": "five", "u": "50"}
    local1 = {"id": 1, "v": "local", "u": 10}
    local9 = {"id": 9, "v": "nine", "u": 50}
    assert _recs(pair) == [
        ("ar", "insert_exists", "apply_remote", one, local1),
        ("ar", "insert_exists", "apply_remote", five, local9),
        ("kl", "insert_exists", "keep_local", one, local1),
        ("kl", "insert_exists", "keep_local", five, local9),
        ("sk", "insert_exists", "skip", one, local1),
        ("sk", "insert_exists", "skip", five, local9),
    ]


@ONE_PAIR
def test_insert_meeting_two_rows_is_multiple_unique_conflicts(pair: Pair) -> None:
    """An INSERT whose primary key one target row holds and whose unique key another
    holds (FULL identity): multiple_unique_conflicts, error by default (exit 3, named,
    nothing changed); with skip, the change is kept out and the rest applied."""
    pair.both(
        "CREATE TABLE t (id int PRIMARY KEY, u int UNIQUE, v text);"
        "ALTER TABLE t REPLICA IDENTITY FULL"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = _config(pair, 'default = { insert_exists = "apply_remote" }\n')
    _slot(pair, cfg)
    pair.sub_exec("INSERT INTO t VALUES (1, 10, 'a'), (2, 20, 'b')")
    pair.pub_exec("INSERT INTO t VALUES (1, 20, 'r')")
    pair.pub_exec("INSERT INTO t VALUES (3, 30, 'c')")
    runner = Runner(pair, cfg).start()
    assert runner.wait(90) == 3
    out = runner.log()
    assert "conflict multiple_unique_conflicts" in out, out[-3000:]
    both = [{"id": 1, "u": 10, "v": "a"}, {"id": 2, "u": 20, "v": "b"}]
    assert _rows(pair, "t") == both
    key = {"id": "1", "u": "20", "v": "r"}
    recs = _recs(pair)
    assert recs == [("t", "multiple_unique_conflicts", "error", key, recs[0][4])], recs
    assert sorted(recs[0][4], key=lambda r: r["id"]) == both
    cfg = _config(
        pair,
        'default = { insert_exists = "apply_remote", multiple_unique_conflicts = "skip" }\n',
    )
    pair.sub_exec("DELETE FROM applier.conflict_log")
    runner = Runner(pair, cfg, "run2.log").start().ready()
    wait_for(lambda: len(_rows(pair, "t")) == 3, 60, "the row after the conflict")
    assert runner.stop() == 0
    assert _rows(pair, "t") == [*both, {"id": 3, "u": 30, "v": "c"}]
    recs = _recs(pair)
    assert [r[:4] for r in recs] == [("t", "multiple_unique_conflicts", "skip", key)], recs


@ONE_PAIR
def test_update_missing_apply_remote_on_full_identity_with_keys(pair: Pair) -> None:
    """update_missing = apply_remote, REPLICA IDENTITY FULL beside a primary key and a
    unique key: an UPDATE whose old row the target lacks inserts the new row, and where
    that row's key is held by a target row, it updates that row (through that index)."""
    pair.both(
        "CREATE TABLE t (id int PRIMARY KEY, v text, u int UNIQUE);"
        "ALTER TABLE t REPLICA IDENTITY FULL"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.pub_exec("INSERT INTO t VALUES (1, 'a', 1), (5, 'x', 50), (7, 's', 70)")
    pair.sub_exec("INSERT INTO t VALUES (1, 'local', 1), (8, 'loc', 70)")
    cfg = _config(pair, 'default = { update_missing = "apply_remote" }\n')
    _slot(pair, cfg)
    pair.pub_exec("UPDATE t SET v = 'upd' WHERE id = 5")  # no such row: inserted
    pair.pub_exec("UPDATE t SET u = 2 WHERE id = 1")  # id 1 differs: that row updated
    pair.pub_exec("UPDATE t SET v = 's2' WHERE id = 7")  # u = 70 is row 8's: updated
    pair.pub_exec("UPDATE t SET v = 'upd2' WHERE id = 5")  # found: a plain update
    runner = Runner(pair, cfg).start().ready()
    wait_for(lambda: len(_log(pair)) == 3, 60, "three conflicts")
    wait_for(lambda: {r["v"] for r in _rows(pair, "t")} == {"a", "upd2", "s2"}, 60)
    assert runner.stop() == 0
    assert _rows(pair, "t") == [
        {"id": 1, "v": "a", "u": 2},
        {"id": 5, "v": "upd2", "u": 50},
        {"id": 7, "v": "s2", "u": 70},
    ]
    assert _recs(pair) == [
        ("t", "update_missing", "apply_remote", {"id": "1", "v": "a", "u": "1"},
         {"id": 1, "v": "local", "u": 1}),
        ("t", "update_missing", "apply_remote", {"id": "5", "v": "x", "u": "50"}, None),
        ("t", "update_missing", "apply_remote", {"id": "7", "v": "s", "u": "70"},
         {"id": 8, "v": "loc", "u": 70}),
    ]  # fmt: skip


@ONE_PAIR
def test_using_index_identity_beside_a_primary_key(pair: Pair) -> None:
    """REPLICA IDENTITY USING INDEX on one unique key beside the primary key: an INSERT
    meeting a row on either is resolved through that index (apply_remote updates it);
    an UPDATE of a missing row is inserted the same way."""
    pair.both(
        "CREATE TABLE t (id int PRIMARY KEY, code text NOT NULL, v text);"
        "CREATE UNIQUE INDEX t_code ON t (code); ALTER TABLE t REPLICA IDENTITY USING INDEX t_code"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.pub_exec("INSERT INTO t VALUES (6, 'f', 'six')")  # not on the target
    cfg = _config(
        pair, 'default = { insert_exists = "apply_remote", update_missing = "apply_remote" }\n'
    )
    _slot(pair, cfg)
    pair.sub_exec("INSERT INTO t VALUES (1, 'a', 'local'), (3, 'c', 'l3'), (7, 'g', 'l7')")
    pair.pub_exec("INSERT INTO t VALUES (1, 'b', 'r')")  # id 1 held: through the primary key
    pair.pub_exec("INSERT INTO t VALUES (2, 'c', 'r2')")  # code c held: through t_code
    pair.pub_exec("UPDATE t SET id = 7 WHERE code = 'f'")  # missing; id 7 held by code g
    runner = Runner(pair, cfg).start().ready()
    wait_for(lambda: len(_log(pair)) == 3, 60, "three conflicts")
    assert runner.stop() == 0
    assert _rows(pair, "t") == [
        {"id": 1, "code": "b", "v": "r"},
        {"id": 2, "code": "c", "v": "r2"},
        {"id": 7, "code": "f", "v": "six"},
    ]
    assert _recs(pair) == [
        ("t", "insert_exists", "apply_remote", {"code": "b"}, {"id": 1, "code": "a", "v": "local"}),
        ("t", "insert_exists", "apply_remote", {"code": "c"}, {"id": 3, "code": "c", "v": "l3"}),
        ("t", "update_missing", "apply_remote", {"code": "f"}, {"id": 7, "code": "g", "v": "l7"}),
    ]


def test_last_update_wins_through_any_unique_key(make_pair: Any) -> None:
    """last_update_wins on a REPLICA IDENTITY FULL table with a primary key and a unique
    key: the local row that holds the INSERT's key, through either index, is replaced only
    when its commit is not newer than the source's."""
    pair = make_pair(15, 18, sub_settings={"track_commit_timestamp": "on"})
    pair.both(
        "CREATE TABLE lww (id int PRIMARY KEY, v text, u int UNIQUE);"
        "ALTER TABLE lww REPLICA IDENTITY FULL"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = _config(pair, '"public.lww" = { insert_exists = "last_update_wins" }\n')
    _slot(pair, cfg)
    pair.sub_exec("INSERT INTO lww VALUES (2, 'local-old', 20)")
    time.sleep(0.05)  # commit timestamps in this order
    pair.pub_exec("INSERT INTO lww VALUES (1, 'remote-old', 10)")
    time.sleep(0.05)
    pair.sub_exec("INSERT INTO lww VALUES (9, 'local-new', 10)")
    time.sleep(0.05)
    pair.pub_exec("INSERT INTO lww VALUES (2, 'remote-new', 20)")
    runner = Runner(pair, cfg).start().ready()
    wait_for(lambda: len(_log(pair)) == 2, 60, "two conflicts")
    assert runner.stop() == 0
    assert _rows(pair, "lww") == [
        {"id": 2, "v": "remote-new", "u": 20},
        {"id": 9, "v": "local-new", "u": 10},
    ]
    assert _recs(pair) == [
        ("lww", "insert_exists", "last_update_wins", {"id": "1", "v": "remote-old", "u": "10"},
         {"id": 9, "v": "local-new", "u": 10}),
        ("lww", "insert_exists", "last_update_wins", {"id": "2", "v": "remote-new", "u": "20"},
         {"id": 2, "v": "local-old", "u": 20}),
    ]  # fmt: skip


@ONE_PAIR
def test_apply_remote_beside_a_generated_always_identity_key(pair: Pair) -> None:
    """A GENERATED ALWAYS identity primary key beside a unique key: apply_remote updates
    the row that holds either key, leaving the identity column out of SET (an UPDATE may
    set it only to DEFAULT); a row without conflict keeps the source's value."""
    pair.both(
        "CREATE TABLE t (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, u int UNIQUE, v text)"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = _config(pair, 'default = { insert_exists = "apply_remote" }\n')
    _slot(pair, cfg)
    pair.sub_exec("INSERT INTO t OVERRIDING SYSTEM VALUE VALUES (1, 10, 'l'), (5, 50, 'l5')")
    pair.pub_exec(
        "INSERT INTO t OVERRIDING SYSTEM VALUE VALUES (1, 11, 'r');"
        "INSERT INTO t OVERRIDING SYSTEM VALUE VALUES (2, 50, 'r2');"
        "INSERT INTO t OVERRIDING SYSTEM VALUE VALUES (3, 30, 'r3')"
    )
    runner = Runner(pair, cfg).start().ready()
    wait_for(lambda: len(_rows(pair, "t")) == 3, 60, "the row without conflict")
    wait_for(lambda: len(_log(pair)) == 2, 60, "two conflicts")
    assert runner.stop() == 0
    assert _rows(pair, "t") == [
        {"id": 1, "u": 11, "v": "r"},
        {"id": 3, "u": 30, "v": "r3"},
        {"id": 5, "u": 50, "v": "r2"},
    ]
    assert [r[:4] for r in _recs(pair)] == [
        ("t", "insert_exists", "apply_remote", {"id": "1"}),
        ("t", "insert_exists", "apply_remote", {"id": "2"}),
    ]
