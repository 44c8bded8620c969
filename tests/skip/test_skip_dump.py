"""`applier skip dump`: kept changes as SQL that replays by hand, and as JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import ONE_PAIR, Pair
from skipkit import add_rule, applier, keep

TABLES = """
CREATE TABLE public."Odd Name" (id int PRIMARY KEY, "Note" text, amount numeric,
                                tags text[], raw bytea, ts timestamptz);
INSERT INTO public."Odd Name" VALUES
    (1, 'one', 1, '{x}', '\\x01', '2020-01-01 00:00:00+00'),
    (2, 'two', 2, '{y}', '\\x02', '2020-01-02 00:00:00+00'),
    (3, 'three', 3, NULL, NULL, NULL);
CREATE TABLE public.tmp_a (id int PRIMARY KEY);
INSERT INTO public.tmp_a SELECT generate_series(1, 5);
CREATE TABLE public.parted (id int, v text) PARTITION BY RANGE (id);
CREATE TABLE public.parted_1 PARTITION OF public.parted FOR VALUES FROM (0) TO (100);
INSERT INTO public.parted SELECT g, 'v' FROM generate_series(1, 5) g;
"""

NOTE = "it's a\nmulti-line \\ note; -- not a comment"
ODD = ("public", "Odd Name")


def _kept(pair: Pair, txn_rule: int, err_rule: int, gone_rule: int) -> None:
    """Three transactions, kept out of order (the dump sorts them)."""
    t3 = {"xid": 102, "commit_lsn": "0/300", "end_lsn": "0/380", "rule_id": err_rule}
    keep(
        pair, pair.slot, **t3, change_no=4, schema_name="public", table_name="Odd Name",
        op="update", skipped=True, key={"id": "1"}, new_row={"id": "1", "Note": "fixed"},
        error='duplicate key value violates unique constraint "x"', sqlstate="23505",
    )  # fmt: skip
    keep(  # an int column sent in binary: its value is no text any input function reads
        pair, pair.slot, **t3, change_no=5, schema_name="public", table_name="Odd Name",
        op="insert", skipped=True, new_row={"id": "\\x0000000c", "Note": "binary"},
        error="invalid input", sqlstate="22P02",
    )  # fmt: skip
    t1 = {"xid": 100, "commit_lsn": "0/100", "end_lsn": "0/180", "rule_id": txn_rule}
    t1["commit_time"] = "2026-01-02 03:04:05+00"
    new10 = {
        "id": "10", "Note": NOTE, "amount": "12.50", "tags": '{a,"b c"}',
        "raw": "\\x00ff", "ts": "2026-01-01 00:00:00+00",
    }  # fmt: skip
    keep(pair, pair.slot, **t1, change_no=1, schema_name=ODD[0], table_name=ODD[1],
         op="insert", skipped=True, new_row=new10)  # fmt: skip
    # raw is absent (unchanged TOAST): the UPDATE must leave it alone.
    keep(pair, pair.slot, **t1, change_no=2, schema_name=ODD[0], table_name=ODD[1],
         op="update", skipped=True, key={"id": "2"},
         old_row={"id": "2", "Note": "two", "amount": "2"},
         new_row={"id": "2", "Note": None, "amount": "7"})  # fmt: skip
    keep(pair, pair.slot, **t1, change_no=3, schema_name=ODD[0], table_name=ODD[1],
         op="delete", skipped=True, key={"id": "3"})  # fmt: skip
    # Applied by the worker, kept for context (dump = all): never to be replayed.
    keep(pair, pair.slot, **t1, change_no=4, schema_name=ODD[0], table_name=ODD[1],
         op="insert", skipped=False, new_row={"id": "11", "Note": "applied"})  # fmt: skip
    t2 = {"xid": 101, "commit_lsn": "0/200", "end_lsn": "0/280", "rule_id": gone_rule}
    for n, table in enumerate(("tmp_a", "parted"), 1):
        keep(pair, pair.slot, **t2, change_no=n, schema_name="public", table_name=table,
             op="truncate", skipped=True)  # fmt: skip


def _psql(pair: Pair, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [pair.sub.bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", pair.sub_dsn,
         "-f", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@ONE_PAIR
def test_dump_sql_replays_the_skipped_changes_and_only_those(pair: Pair) -> None:
    cfg = pair.write_config()
    txn_rule = add_rule(cfg, "--xid", "100")
    err_rule = add_rule(cfg, "--error", "--sqlstate", "23505,22P02")
    gone_rule = add_rule(cfg, "--table", "public.*", "--op", "truncate")
    pair.sub_exec(TABLES)
    _kept(pair, txn_rule, err_rule, gone_rule)
    proc = applier("skip", "remove", "--config", cfg, str(gone_rule))
    assert proc.returncode == 0, proc.stderr

    proc = applier("skip", "dump", "--config", cfg)
    assert proc.returncode == 0, proc.stderr
    dump = proc.stdout
    # One block per transaction, in commit order, with what identifies it.
    heads = [line for line in dump.splitlines() if line.startswith("-- transaction")]
    assert [h.split(",")[0] for h in heads] == [
        "-- transaction xid 100", "-- transaction xid 101", "-- transaction xid 102",
    ]  # fmt: skip
    assert "commit LSN 0/100, end LSN 0/180, committed 2026-01-02T03:04:05+00:00" in heads[0]
    assert f"kept by rule {txn_rule}: 3 skipped, 1 applied" in dump
    assert "kept by a rule since removed: 2 skipped" in dump
    assert "SQLSTATE 23505" in dump and 'violates unique constraint "x"' in dump
    assert dump.count("BEGIN;") == 3 and dump.count("COMMIT;") == 3
    assert "applied, kept for context: do not replay" in dump
    assert "NOT REPLAYABLE as written: column(s) id came in binary" in dump
    assert 'TRUNCATE ONLY "public"."tmp_a";' in dump
    assert 'TRUNCATE "public"."parted";' in dump  # partitioned: its partitions too

    path = pair.workdir / "dump.sql"
    path.write_text(dump)
    replay = _psql(pair, path)
    assert replay.returncode == 0, replay.stderr

    rows = pair.sub_exec(
        "SELECT id, \"Note\", amount::text, tags::text, raw::text, ts = '2026-01-01Z' "
        'FROM public."Odd Name" ORDER BY id'
    )
    assert rows == [
        (1, "fixed", "1", "{x}", "\\x01", False),
        (2, None, "7", "{y}", "\\x02", False),  # raw untouched: it was not sent
        (10, NOTE, "12.50", '{a,"b c"}', "\\x00ff", True),
    ]  # 3 deleted; 11 (applied, context) and 12 (binary) not replayed
    assert pair.sub_exec("SELECT count(*) FROM public.tmp_a") == [(0,)]
    assert pair.sub_exec("SELECT count(*) FROM public.parted") == [(0,)]

    # Uncommenting the context change gives exactly the statement that was applied.
    lines = dump.splitlines()
    at = lines.index(next(x for x in lines if "applied, kept for context" in x))
    assert (
        lines[at + 1]
        == '-- INSERT INTO "public"."Odd Name" ("id", "Note") VALUES (\'11\', \'applied\');'
    )


@ONE_PAIR
def test_dump_one_transaction_and_json(pair: Pair) -> None:
    cfg = pair.write_config()
    rules = [
        add_rule(cfg, "--xid", "100"),
        add_rule(cfg, "--error"),
        add_rule(cfg, "--error", "--dump", "all"),
    ]
    _kept(pair, *rules)

    one = applier("skip", "dump", "--config", cfg, "--xid", "101")
    assert one.returncode == 0, one.stderr
    assert "xid 101" in one.stdout and "xid 100" not in one.stdout and "xid 102" not in one.stdout
    by_lsn = applier("skip", "dump", "--config", cfg, "--lsn", "0/300", "--format", "json")
    assert {r["xid"] for r in json.loads(by_lsn.stdout)} == {102}

    proc = applier("skip", "dump", "--config", cfg, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["xid"], r["change_no"]) for r in rows] == [
        (100, 1), (100, 2), (100, 3), (100, 4), (101, 1), (101, 2), (102, 4), (102, 5),
    ]  # fmt: skip
    first = rows[0]
    assert first["commit_lsn"] == "0/100" and first["end_lsn"] == "0/180"
    assert first["schema_name"] == "public" and first["table_name"] == "Odd Name"
    assert first["op"] == "insert" and first["skipped"] is True
    assert first["new_row"]["Note"] == NOTE and first["rule_id"] == rules[0]
    assert rows[3]["skipped"] is False
    assert rows[6]["sqlstate"] == "23505" and rows[6]["key"] == {"id": "1"}
    assert rows[4]["new_row"] is None and rows[4]["op"] == "truncate"

    # Another origin has no kept changes.
    other = pair.write_config(target={"origin": f"o_{pair.pub_db}"})
    assert json.loads(applier("skip", "dump", "--config", other, "--format", "json").stdout) == []
