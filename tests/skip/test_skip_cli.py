"""`applier skip add/list/remove` against a real target: kinds, defaults, bad input."""

from __future__ import annotations

import datetime as dt

import pytest
from conftest import Pair
from skipkit import add_rule, applier, keep, rules_json

from applier.schema import upgrade_target

# The CLI's parsing and the rules' rows in the applier schema: the same SQL on a 15
# and an 18 target (the worker's use of the rules runs on both, in tests/apply).
pytestmark = pytest.mark.parametrize("pair", ["15-18"], indirect=True)


def test_add_each_kind_with_its_defaults_and_list_them(pair: Pair) -> None:
    cfg = pair.write_config()  # the schema is not there yet: `skip add` creates it
    obj = add_rule(cfg, "--table", "public.tmp_*")
    obj2 = add_rule(cfg, "--table", "sales.*", "--op", "insert,update", "--dump", "none")
    by_xid = add_rule(cfg, "--xid", "4294967295")
    by_lsn = add_rule(cfg, "--lsn", "0/1a2b3c4")
    err = add_rule(cfg, "--error")
    err2 = add_rule(
        cfg, "--error", "--table", "public.t", "--op", "insert",
        "--sqlstate", "23505,23503", "--dump", "all",
    )  # fmt: skip
    ddl = add_rule(cfg, "--ddl-lsn", "0/16b3748")
    assert len({obj, obj2, by_xid, by_lsn, err, err2, ddl}) == 7

    rules = {r["id"]: r for r in rules_json(cfg)}
    assert set(rules) == {obj, obj2, by_xid, by_lsn, err, err2, ddl}
    expected = {
        obj: ("object", "public.tmp_*", None, None, None, None, "skipped"),
        obj2: ("object", "sales.*", ["insert", "update"], None, None, None, "none"),
        by_xid: ("txn", None, None, 4294967295, None, None, "all"),
        by_lsn: ("txn", None, None, None, "0/1A2B3C4", None, "all"),
        err: ("error", None, None, None, None, None, "skipped"),
        err2: ("error", "public.t", ["insert"], None, None, ["23505", "23503"], "all"),
        ddl: ("ddl", None, None, None, "0/16B3748", None, "skipped"),
    }
    for rid, (kind, table, op, xid, lsn, sqlstate, dump) in expected.items():
        r = rules[rid]
        got = (r["kind"], r["table"], r["op"], r["xid"], r["lsn"], r["sqlstate"], r["dump"])
        assert got == (kind, table, op, xid, lsn, sqlstate, dump), r
        assert r["done"] is False and r["done_at"] is None and r["done_end_lsn"] is None
        assert dt.datetime.fromisoformat(r["created_at"]).tzinfo is not None
        assert r["kept"] == 0

    # The same command twice makes one rule (an operator re-running a printed command).
    again = applier("skip", "add", "--config", cfg, "--lsn", "0/1A2B3C4")
    assert again.returncode == 0 and int(again.stdout) == by_lsn
    assert "identical" in again.stderr
    assert len(rules_json(cfg)) == 7

    # The worker marks a used transaction rule done: listed by default, not with --active.
    pair.sub_exec(
        "UPDATE applier.skip_rules SET done = true, done_at = now(), "
        f"done_end_lsn = '0/1A2B400' WHERE id = {by_lsn}"
    )
    done = {r["id"]: r for r in rules_json(cfg)}[by_lsn]
    assert done["done"] is True and done["done_end_lsn"] == "0/1A2B400" and done["done_at"]
    assert by_lsn not in {r["id"] for r in rules_json(cfg, "--active")}
    assert len(rules_json(cfg, "--active")) == 6

    text = applier("skip", "list", "--config", cfg)
    assert text.returncode == 0, text.stderr
    for word in (
        "public.tmp_*",
        "xid 4294967295",
        "lsn 0/1A2B3C4",
        "sqlstate 23505,23503",
        "ddl statement at lsn 0/16B3748",
    ):
        assert word in text.stdout
    assert "done" in text.stdout and "active" in text.stdout

    # Rules are per origin: another origin on the same target sees none of them.
    other = pair.write_config(target={"origin": f"o_{pair.pub_db}"})
    assert rules_json(other) == []
    assert "no skip rules" in applier("skip", "list", "--config", other).stdout


def test_an_lsn_already_applied_is_added_with_a_warning(pair: Pair) -> None:
    cfg = pair.write_config()
    pair.sub_exec(f"SELECT pg_replication_origin_create('{pair.slot}')")
    pair.sub_exec(f"SELECT pg_replication_origin_advance('{pair.slot}', '0/5000000')")
    proc = applier("skip", "add", "--config", cfg, "--lsn", "0/4000000")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().isdigit()
    assert "applied already" in proc.stderr and "0/5000000" in proc.stderr
    proc = applier("skip", "add", "--config", cfg, "--lsn", "0/6000000")
    assert proc.returncode == 0 and "warning" not in proc.stderr


BAD = [
    ([], "say what to skip"),
    (["--op", "insert"], "say what to skip"),
    (["--xid", "1", "--lsn", "0/1"], "give one"),
    (["--xid", "4294967296"], "4294967296"),
    (["--xid", "-1"], "-1"),
    (["--xid", "abc"], "abc"),
    (["--lsn", "nonsense"], "invalid LSN"),
    (["--lsn", "0/0"], "no transaction's LSN"),
    (["--lsn", "0/1", "--error"], "two kinds"),
    (["--table", "public"], "schema.table"),
    (["--table", "a.b.c"], "schema.table"),
    (["--table", "a.b", "--op", "insert,upsert"], "'upsert'"),
    (["--table", "a.b", "--op", ""], "--op"),
    (["--error", "--sqlstate", "2350"], "'2350' is not a SQLSTATE"),
    (["--error", "--sqlstate", "23505,23-03"], "'23-03'"),
    (["--table", "a.b", "--sqlstate", "23505"], "only goes with --error"),
    (["--xid", "5", "--table", "a.b"], "transaction rule"),
    (["--lsn", "0/5", "--op", "insert"], "transaction rule"),
    (["--table", "a.b", "--dump", "some"], "'some'"),
    (["--ddl-lsn", "0/0"], "no message's LSN"),
    (["--ddl-lsn", "0/5", "--lsn", "0/5"], "--ddl-lsn skips one captured DDL statement"),
    (["--ddl-lsn", "0/5", "--table", "a.b"], "--ddl-lsn skips one captured DDL statement"),
    (["--ddl-lsn", "0/5", "--dump", "all"], "a DDL rule keeps the statement"),
]


def test_bad_input_exits_2_names_the_problem_and_writes_nothing(pair: Pair) -> None:
    upgrade_target(pair.sub_dsn)
    cfg = pair.write_config()
    for args, says in BAD:
        proc = applier("skip", "add", "--config", cfg, *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert says in proc.stderr, (args, proc.stderr)
        assert proc.stdout == "", args
        assert "Traceback" not in proc.stderr
    assert pair.sub_exec("SELECT count(*) FROM applier.skip_rules") == [(0,)]

    proc = applier("skip", "remove", "--config", cfg, "12345")
    assert proc.returncode == 2 and "no skip rule 12345" in proc.stderr
    proc = applier("skip", "dump", "--config", cfg, "--format", "xml")
    assert proc.returncode == 2


def test_remove_deletes_the_rule_and_keeps_its_changes(pair: Pair) -> None:
    cfg = pair.write_config()
    rid = add_rule(cfg, "--table", "public.t")
    keep_one = add_rule(cfg, "--error")
    keep(
        pair, pair.slot, rule_id=rid, xid=7, commit_lsn="0/10", change_no=1,
        schema_name="public", table_name="t", op="delete", skipped=True, key={"id": "1"},
    )  # fmt: skip
    assert {r["id"]: r["kept"] for r in rules_json(cfg)} == {rid: 1, keep_one: 0}

    # Another origin cannot remove this origin's rule.
    other = pair.write_config(target={"origin": f"o_{pair.pub_db}"})
    proc = applier("skip", "remove", "--config", other, str(rid))
    assert proc.returncode == 2 and "no skip rule" in proc.stderr

    proc = applier("skip", "remove", "--config", cfg, str(rid))
    assert proc.returncode == 0, proc.stderr
    assert "1 kept change" in proc.stderr
    assert [r["id"] for r in rules_json(cfg)] == [keep_one]
    assert pair.sub_exec("SELECT rule_id, xid FROM applier.skipped_changes") == [(None, 7)]

    proc = applier("skip", "remove", "--config", cfg, str(rid))
    assert proc.returncode == 2 and f"no skip rule {rid}" in proc.stderr


# A target without the applier schema: the readers must not make it.
@pytest.mark.bare_target
@pytest.mark.parametrize("command", ["list", "dump"])
def test_readers_never_write_the_schema(pair: Pair, command: str) -> None:
    cfg = pair.write_config()
    proc = applier("skip", command, "--config", cfg)
    assert proc.returncode == 0, proc.stderr
    assert pair.sub_exec("SELECT to_regclass('applier.skip_rules')") == [(None,)]


def test_an_unreachable_target_is_transient_and_secret_free(pair: Pair) -> None:
    cfg = pair.write_config(target={"dsn": "host=127.0.0.1 port=1 dbname=x user=u password=s3cr"})
    for args in (["add", "--table", "a.b"], ["list"], ["dump"], ["remove", "1"]):
        proc = applier("skip", args[0], "--config", cfg, *args[1:])
        assert proc.returncode == 1, (args, proc.stderr)
        assert "target" in proc.stderr and "s3cr" not in proc.stderr
        assert "Traceback" not in proc.stderr
