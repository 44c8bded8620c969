"""Target tables with ALWAYS rules or statement triggers are applied row by row, and a
table without a replica identity replicates its INSERTs (issue 12, items 16 and 17)."""

from __future__ import annotations

from applykit import Runner, wait_equal, wait_for
from conftest import ONE_PAIR, Pair

WATCHED = """
CREATE TABLE t (id int PRIMARY KEY, v text);
CREATE TABLE rlog (id int);
CREATE TABLE slog (op text, n int);
"""
# Only on the target: a rule and a statement trigger with a transition table, both
# fired for replication (session_replication_role = replica).
TARGET_WATCHERS = """
CREATE RULE keep AS ON INSERT TO t DO ALSO INSERT INTO rlog VALUES (NEW.id);
ALTER TABLE t ENABLE ALWAYS RULE keep;
CREATE FUNCTION count_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO public.slog SELECT TG_OP, count(*) FROM new_rows;
  ELSE
    INSERT INTO public.slog SELECT TG_OP, count(*) FROM old_rows;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER count_ins AFTER INSERT ON t REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION count_rows();
CREATE TRIGGER count_upd AFTER UPDATE ON t REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION count_rows();
ALTER TABLE t ENABLE ALWAYS TRIGGER count_ins;
ALTER TABLE t ENABLE ALWAYS TRIGGER count_upd;
"""


@ONE_PAIR
def test_rules_and_statement_triggers_see_one_row_per_statement(pair: Pair) -> None:
    pair.both(WATCHED)
    pair.sub_exec(TARGET_WATCHERS)
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    runner = Runner(pair, pair.write_config(apply={"copy_threshold": 8})).start().ready()
    # One source transaction: a long run of INSERTs (COPY), a short one (multi-row
    # INSERT), then UPDATEs of the same keys (merged UPDATE ... FROM).
    pair.pub_exec(
        "BEGIN;"
        "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 100) g;"
        "INSERT INTO t SELECT g, 'b' FROM generate_series(101, 104) g;"
        "UPDATE t SET v = 'u' WHERE id <= 5;"
        "UPDATE t SET v = 'w' WHERE id <= 5;"
        "COMMIT"
    )
    wait_equal(pair, ["t"], runner=runner)
    # The rule fired for every row (COPY fires no rules).
    assert pair.sub_exec("SELECT count(*), count(DISTINCT id) FROM rlog") == [(104, 104)]
    # One row per statement, as one INSERT/UPDATE per source row.
    assert pair.sub_exec("SELECT op, count(*), max(n) FROM slog GROUP BY op ORDER BY op") == [
        ("INSERT", 104, 1),
        ("UPDATE", 10, 1),
    ]
    assert runner.stop() == 0


@ONE_PAIR
def test_table_without_replica_identity_replicates_inserts(pair: Pair) -> None:
    pair.both("CREATE TABLE log (at timestamptz DEFAULT now(), msg text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE log")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("INSERT INTO log (msg) SELECT 'm' || g FROM generate_series(1, 200) g")
    pair.pub_exec("INSERT INTO log (msg) VALUES ('one more')")
    wait_for(
        lambda: pair.sub_exec("SELECT count(*) FROM log") == [(201,)] or not runner.alive(),
        what="the log rows",
    )
    wait_equal(pair, ["log"], runner=runner, order="t.msg")
    assert runner.alive()
    assert runner.stop() == 0
