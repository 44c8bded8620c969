"""TRUNCATE never cascades on the target; inheritance parents are changed with ONLY
(issue 12, items 3 and 4)."""

from __future__ import annotations

from applykit import Runner, origin_lsn, wait_equal, wait_for
from conftest import ONE_PAIR, Pair

SCHEMA = """
CREATE TABLE p (id int PRIMARY KEY, v text);
CREATE TABLE c (id int PRIMARY KEY, p_id int REFERENCES p (id), w text);
"""


@ONE_PAIR
def test_truncate_cascade_lists_every_relation(pair: Pair) -> None:
    pair.both(SCHEMA)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("INSERT INTO p SELECT g, 'p' FROM generate_series(1, 5) g")
    pair.pub_exec("INSERT INTO c SELECT g, g, 'c' FROM generate_series(1, 5) g")
    wait_equal(pair, ["p", "c"], runner=runner)
    pair.pub_exec("TRUNCATE p CASCADE")
    pair.pub_exec("INSERT INTO p VALUES (9, 'after')")
    wait_equal(pair, ["p", "c"], runner=runner)
    assert pair.sub_exec("SELECT count(*) FROM c") == [(0,)]
    assert runner.stop() == 0


@ONE_PAIR
def test_truncate_refuses_a_target_only_referencing_table(pair: Pair) -> None:
    pair.both(SCHEMA)
    # Only on the target: a table that references a published one.
    pair.sub_exec("CREATE TABLE audit (id int PRIMARY KEY, p_id int REFERENCES p (id))")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config()).start().ready()
    pair.pub_exec("INSERT INTO p SELECT g, 'p' FROM generate_series(1, 5) g")
    pair.pub_exec("INSERT INTO c SELECT g, g, 'c' FROM generate_series(1, 5) g")
    wait_equal(pair, ["p", "c"], runner=runner)
    pair.sub_exec("INSERT INTO audit VALUES (1, 1)")
    before = origin_lsn(pair, pair.slot)
    pair.pub_exec("TRUNCATE p CASCADE")
    assert runner.wait(60) == 3
    line = [ln for ln in runner.log().splitlines() if " applier: error: " in ln][-1]
    assert "public.audit" in line and "public.p" in line, line
    assert "lsn=" in line and "xid=" in line, line
    assert pair.sub_exec("SELECT count(*) FROM audit") == [(1,)]
    assert pair.sub_exec("SELECT count(*) FROM p") == [(5,)]
    assert pair.sub_exec("SELECT count(*) FROM c") == [(5,)]
    assert origin_lsn(pair, pair.slot) == before


INHERIT = """
CREATE TABLE parent (id int PRIMARY KEY, v text);
CREATE TABLE child (extra int) INHERITS (parent);
ALTER TABLE child ADD PRIMARY KEY (id);
CREATE TABLE fparent (id int, v text);
ALTER TABLE fparent REPLICA IDENTITY FULL;
CREATE TABLE fchild () INHERITS (fparent);
ALTER TABLE fchild REPLICA IDENTITY FULL;
"""


def _only(pair: Pair, side: str, table: str) -> list[str]:
    q = f"SELECT row_to_json(t)::text FROM ONLY {table} t ORDER BY 1"
    rows = pair.pub_exec(q) if side == "pub" else pair.sub_exec(q)
    return [r[0] for r in rows]


def _same_only(pair: Pair, tables: list[str]) -> bool:
    return all(_only(pair, "pub", t) == _only(pair, "sub", t) for t in tables)


@ONE_PAIR
def test_inheritance_parent_changes_only_its_own_rows(pair: Pair) -> None:
    pair.both(INHERIT)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    tables = ["parent", "child", "fparent", "fchild"]
    # merge_updates: several UPDATEs of one key in a group become one UPDATE ... FROM.
    runner = Runner(pair, pair.write_config(apply={"merge_updates": True})).start().ready()
    # The same keys in the parent and the child; unrelated rows at the same ctids.
    pair.pub_exec(
        "INSERT INTO parent SELECT g, 'p' || g FROM generate_series(1, 20) g;"
        "INSERT INTO child SELECT g, 'c' || g, g FROM generate_series(1, 20) g;"
        "INSERT INTO fparent SELECT g, 'same' FROM generate_series(1, 5) g;"
        "INSERT INTO fchild SELECT g, 'same' FROM generate_series(1, 5) g;"
    )
    pair.pub_exec(
        "BEGIN;"
        "UPDATE ONLY parent SET v = 'p-updated' WHERE id <= 10;"
        "UPDATE ONLY parent SET v = 'p-updated-again' WHERE id <= 10;"
        "DELETE FROM ONLY parent WHERE id > 15;"
        "UPDATE ONLY fparent SET v = 'f-updated' WHERE id = 1;"
        "DELETE FROM ONLY fparent WHERE id = 2;"
        "COMMIT"
    )
    pair.pub_exec("UPDATE ONLY parent SET v = 'single' WHERE id = 11")
    pair.pub_exec("INSERT INTO parent VALUES (100, 'last')")
    wait_for(
        lambda: _same_only(pair, tables) or not runner.alive(),
        timeout=30,
        what="parent and child rows equal",
    )
    for t in tables:
        assert _only(pair, "pub", t) == _only(pair, "sub", t), (t, runner.log()[-3000:])
    assert runner.stop() == 0
