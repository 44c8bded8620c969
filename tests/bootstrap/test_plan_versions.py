"""The bootstrap's source discovery for sources before 12: the partition tree from
pg_inherits gives the rows pg_partition_tree/pg_partition_ancestors give (checked here
on 15 and 18, where both queries run)."""

from __future__ import annotations

from applier.bootstrap.plan import _TREE, _TREE_PRE12, tree_sql
from applier.localpg import LocalCluster

TABLES = ["m", "m_a", "m_a_1", "m_a_2", "m_b", "plain", "plain_child"]


def test_tree_query_by_version() -> None:
    assert tree_sql(110022) is _TREE_PRE12
    assert tree_sql(120000) is _TREE


def test_pre12_tree_query_matches_pg_partition_tree(
    publisher: tuple[LocalCluster, str],
) -> None:
    cluster, db = publisher
    with cluster.connect(db) as conn:
        conn.execute(
            """
            CREATE TABLE m (id int, k int, PRIMARY KEY (id, k)) PARTITION BY LIST (k);
            CREATE TABLE m_a PARTITION OF m FOR VALUES IN (1, 2) PARTITION BY LIST (k);
            CREATE TABLE m_a_1 PARTITION OF m_a FOR VALUES IN (1);
            CREATE TABLE m_a_2 PARTITION OF m_a FOR VALUES IN (2);
            CREATE TABLE m_b PARTITION OF m FOR VALUES IN (3);
            INSERT INTO m SELECT g, 1 + g % 3 FROM generate_series(1, 300) g;
            CREATE TABLE plain (id int);
            CREATE TABLE plain_child () INHERITS (plain);  -- not a partition: not followed
            ANALYZE;
            """
        )
        for table in TABLES:
            new = conn.execute(_TREE, {"oid": table}).fetchall()
            old = conn.execute(_TREE_PRE12, {"oid": table}).fetchall()
            assert sorted(old) == sorted(new), table
