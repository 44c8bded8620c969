"""Write sets of parallel apply: from a real pgoutput stream, and the rules' corners.

The first test runs transactions on a real source, reads their pgoutput
messages from a slot, decodes them with applier's decoder and keys them with
the target's real unique indexes and foreign keys (:func:`tablekeys.load`),
then asks which pairs of transactions conflict: the same row, a key moved
between rows, a unique value moved between rows, parent and child in separate
transactions, two children of one parent, a FULL identity table, TRUNCATE, a
watched table and a captured DDL message. The others build mappings by hand
for what a stream rarely shows (NULLs in unique keys, unchanged TOAST values,
foreign keys of differing types).
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Pair

from applier.apply.parallel.schedule import Schedule
from applier.apply.parallel.tablekeys import ForeignKey, TargetKeys, UniqueIndex, load
from applier.apply.parallel.writeset import Collector, KeySpace, TableKeys, WriteSet
from applier.apply.sql.mapping import Catalog, RelMap, TargetColumn, TargetTable, build
from applier.pgconn import connect
from applier.protocol import (
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    Message,
    Relation,
    Truncate,
    TupleData,
    Update,
)
from applier.protocol.decoder import PgOutputDecoder

SCHEMA = """
CREATE TABLE acc (id int PRIMARY KEY, bal int);
CREATE TABLE users (id int PRIMARY KEY, email text UNIQUE, note text);
CREATE TABLE parent (k int PRIMARY KEY);
CREATE TABLE child (id int PRIMARY KEY, k int REFERENCES parent);
CREATE TABLE fullt (a int, b text);
ALTER TABLE fullt REPLICA IDENTITY FULL;
CREATE TABLE watched (id int PRIMARY KEY);
INSERT INTO acc VALUES (1, 0), (2, 0);
INSERT INTO users VALUES (1, 'a@x', '');
INSERT INTO fullt VALUES (1, 'x'), (2, 'x');
"""

#: One transaction each, in this order (T1 is the first).
HISTORY = [
    "UPDATE acc SET bal = bal + 1 WHERE id = 1",  # T1
    "UPDATE acc SET bal = bal + 1 WHERE id = 2",  # T2
    "UPDATE acc SET bal = bal + 1 WHERE id = 1",  # T3: the row of T1
    "UPDATE acc SET id = 10 WHERE id = 2",  # T4: key 2 moves to 10
    "INSERT INTO acc VALUES (2, 0)",  # T5: key 2 again
    "UPDATE users SET email = 'b@x' WHERE id = 1",  # T6: a unique value moves away
    "INSERT INTO users VALUES (2, 'a@x', '')",  # T7: and is taken by another row
    "INSERT INTO parent VALUES (5)",  # T8
    "INSERT INTO child VALUES (1, 5)",  # T9: a child of T8's row
    "INSERT INTO child VALUES (2, 5)",  # T10: another child of it
    "INSERT INTO child VALUES (3, NULL)",  # T11: no parent
    "UPDATE fullt SET b = 'y' WHERE a = 1",  # T12: FULL identity, no unique index
    "INSERT INTO fullt VALUES (3, 'z')",  # T13
    "INSERT INTO fullt VALUES (4, 'z')",  # T14
    "TRUNCATE acc",  # T15
    "INSERT INTO watched VALUES (1)",  # T16: a trigger fires on the target
    "INSERT INTO parent VALUES (6); "
    "SELECT pg_logical_emit_message(true, 'applier.ddl', '{}')",  # T17
    "INSERT INTO acc VALUES (1, 0)",  # T18: the key of T1 again, after the TRUNCATE
]


def stream_write_sets(pair: Pair) -> list[WriteSet]:
    pair.both(SCHEMA)
    pair.sub_exec(
        "CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;"
        "CREATE TRIGGER w BEFORE INSERT ON watched FOR EACH ROW EXECUTE FUNCTION noop();"
        "ALTER TABLE watched ENABLE ALWAYS TRIGGER w"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput')")
    for statement in HISTORY:
        pair.pub_exec(f"BEGIN; {statement}; COMMIT")
    rows = pair.pub_exec(
        f"SELECT data FROM pg_logical_slot_get_binary_changes('{pair.slot}', NULL, NULL, "
        "'proto_version', '1', 'publication_names', 'pub', 'messages', 'true')"
    )
    decoder = PgOutputDecoder()
    space = KeySpace()
    tables: dict[int, TableKeys] = {}
    sets: list[WriteSet] = []
    collector = Collector()
    with connect(pair.sub_dsn, side="target", purpose="applier test") as conn:
        catalog = Catalog(conn)
        for (data,) in rows:
            m = decoder.decode(bytes(data))
            if isinstance(m, Relation):
                target = catalog.table(m.namespace, m.name)
                assert target is not None
                rm = build(m, target)
                tables[m.oid] = TableKeys.build(rm, load(conn, target.oid), space)
            elif isinstance(m, Begin):
                assert not collector.writes and not collector.reads
            elif isinstance(m, Insert):
                collector.insert(tables[m.relation_oid], m)
            elif isinstance(m, Update):
                collector.update(tables[m.relation_oid], m)
            elif isinstance(m, Delete):
                collector.delete(tables[m.relation_oid], m)
            elif isinstance(m, Truncate):
                collector.truncate()
            elif isinstance(m, Message):
                collector.message(m)
            elif isinstance(m, Commit):
                sets.append(collector.take())
    assert len(sets) == len(HISTORY)
    return sets


def test_write_sets_from_a_real_stream(pair: Pair) -> None:
    sets = stream_write_sets(pair)

    def conflict(a: int, b: int) -> bool:
        return sets[a - 1].conflicts(sets[b - 1])

    assert not conflict(1, 2)  # different rows
    assert conflict(1, 3)  # the same row
    assert conflict(2, 4)  # the row T4 moves
    assert conflict(4, 5) and conflict(2, 5)  # key 2 freed by T4, taken by T5
    assert not conflict(3, 4)
    assert conflict(6, 7)  # 'a@x' moved away by T6 (old value unsent: its table)
    assert not conflict(1, 6) and not conflict(5, 7)
    assert conflict(8, 9) and conflict(8, 10)  # children wait for their parent
    assert not conflict(9, 10)  # two children of one parent read it: no conflict
    assert not conflict(8, 11)  # a NULL reference reads nothing
    assert conflict(12, 13)  # FULL without a unique index: the change writes its table
    assert not conflict(13, 14)  # inserts only read it
    assert not conflict(12, 1) and not conflict(13, 9)
    assert [i + 1 for i, ws in enumerate(sets) if ws.barrier] == [15, 16, 17]
    assert sets[14].barrier == "TRUNCATE"
    assert sets[15].barrier is not None and "public.watched" in sets[15].barrier
    assert sets[16].barrier == "a schema change"
    assert conflict(18, 1) and not conflict(18, 2)
    # Scheduled with a session per transaction: what may start before anything commits.
    schedule = Schedule()
    for ws in sets:
        schedule.add(ws)
    assert schedule.ready() == [1, 2, 6, 8, 11, 12]
    started = [schedule.next_ready() for _ in range(6)]
    assert schedule.commit(1) == [3]  # T3 waited for T1 only
    for seq in range(2, 15):
        while schedule.next_ready() is not None:
            pass
        schedule.commit(seq)
    assert schedule.ready() == [15] and started == [1, 2, 6, 8, 11, 12]  # the TRUNCATE


def test_table_keys_from_a_real_target(pair: Pair) -> None:
    """What tablekeys.load reads: key columns without INCLUDE columns, NULLS NOT
    DISTINCT, what cannot be keyed, foreign keys' types and whether they fire."""
    pair.sub_exec(
        """
        CREATE TABLE p (a int, b int, PRIMARY KEY (b, a));
        CREATE TABLE p8 (k bigint PRIMARY KEY);
        CREATE TABLE t (
            id int PRIMARY KEY, x int, y int, r int4range, a int, b int, k bigint,
            UNIQUE (x) INCLUDE (y),
            UNIQUE NULLS NOT DISTINCT (y),
            EXCLUDE USING gist (r WITH &&),
            FOREIGN KEY (a, b) REFERENCES p (a, b),
            FOREIGN KEY (x) REFERENCES p8 (k)
        );
        CREATE UNIQUE INDEX ON t (a) WHERE a > 0;
        CREATE UNIQUE INDEX ON t (lower(k::text));
        CREATE TABLE c2 (id int PRIMARY KEY, k bigint REFERENCES p8);
        DO $$ DECLARE n name; BEGIN
            -- Only by name: ENABLE ALWAYS TRIGGER takes no ALL.
            FOR n IN SELECT tgname FROM pg_trigger WHERE tgrelid = 'c2'::regclass AND tgisinternal
            LOOP EXECUTE format('ALTER TABLE c2 ENABLE ALWAYS TRIGGER %I', n); END LOOP;
        END $$;
        """
    )
    with connect(pair.sub_dsn, side="target", purpose="applier test") as conn:
        oid = conn.execute("SELECT 'public.t'::regclass::oid").fetchone()[0]  # type: ignore[index]
        keys = load(conn, int(oid))
        p, p8 = (
            int(conn.execute(f"SELECT 'public.{n}'::regclass::oid").fetchone()[0])  # type: ignore[index]
            for n in ("p", "p8")
        )
        c2 = load(conn, int(conn.execute("SELECT 'public.c2'::regclass::oid").fetchone()[0]))  # type: ignore[index]
    assert sorted(keys.unique, key=repr) == sorted(
        [
            UniqueIndex(("id",), True),
            UniqueIndex(("x",), True),
            UniqueIndex(("y",), True, nulls_collide=True),
            UniqueIndex(("r",), False),
            UniqueIndex(("a",), False),
            UniqueIndex((), False),  # the expression index: no plain column
        ],
        key=repr,
    )
    assert sorted(keys.foreign, key=repr) == sorted(
        [
            ForeignKey(p, (("a", "a"), ("b", "b")), True, False),
            ForeignKey(p8, (("x", "k"),), False, False),
        ],
        key=repr,
    )
    assert c2.foreign == (ForeignKey(p8, (("k", "k"),), True, True),)


# -- the rules' corners, on mappings built by hand -------------------------------------

INT4, TEXT = 23, 25


def mapping(
    name: str, cols: list[tuple[str, bool]], replident: str = "d", observed: bool = False
) -> RelMap:
    """A mapping of ``name`` with columns (name, in the identity), all int4 but 't...' text."""
    columns = tuple(
        Column(1 if key else 0, c, TEXT if c.startswith("t") else INT4, -1) for c, key in cols
    )
    rel = Relation(None, hash(name) & 0xFFFF, "public", name, replident, columns)
    target = TargetTable(
        hash(name) & 0xFFFF,
        "public",
        name,
        "r",
        {c.name: TargetColumn(c.name, c.type_oid, "x", True, False) for c in columns},
        observed=observed,
    )
    return build(rel, target)


def tup(*values: Any) -> TupleData:
    kinds = bytes(ord("n") if v is None else ord("u") if v is ... else ord("t") for v in values)
    return TupleData(
        kinds, tuple(None if v is None or v is ... else str(v).encode() for v in values)
    )


def one(fn: Any, tk: TableKeys, change: Any) -> WriteSet:
    c = Collector()
    fn(c, tk, change)
    return c.take()


def test_nulls_in_unique_keys() -> None:
    space = KeySpace()
    rm = mapping("u", [("id", True), ("x", False), ("y", False)])
    keys = TargetKeys(
        rm.target.oid,  # type: ignore[union-attr]
        (UniqueIndex(("id",), True), UniqueIndex(("x",), True), UniqueIndex(("y",), True, True)),
    )
    tk = TableKeys.build(rm, keys, space)
    a = one(Collector.insert, tk, Insert(None, 1, tup(1, None, None)))
    b = one(Collector.insert, tk, Insert(None, 1, tup(2, None, 7)))
    c = one(Collector.insert, tk, Insert(None, 1, tup(3, 8, None)))
    assert not a.conflicts(b)  # NULL x is distinct
    assert a.conflicts(c)  # NULL y is not (NULLS NOT DISTINCT)


def test_unsent_toast_and_untracked_old_values_write_the_table() -> None:
    space = KeySpace()
    rm = mapping("v", [("id", True), ("tdoc", False)])
    keys = TargetKeys(rm.target.oid, (UniqueIndex(("id",), True), UniqueIndex(("tdoc",), True)))  # type: ignore[union-attr]
    tk = TableKeys.build(rm, keys, space)
    ins = one(Collector.insert, tk, Insert(None, 1, tup(9, "z")))
    upd = one(Collector.update, tk, Update(None, 1, None, None, tup(1, ...)))
    dele = one(Collector.delete, tk, Delete(None, 1, tup(2, None), "K"))
    assert tk.table in upd.writes and tk.table in dele.writes
    assert upd.conflicts(ins) and dele.conflicts(ins)
    # A table whose unique indexes are all in its identity keys rows only.
    rm2 = mapping("w", [("id", True), ("n", False)])
    tk2 = TableKeys.build(rm2, TargetKeys(rm2.target.oid, (UniqueIndex(("id",), True),)), space)  # type: ignore[union-attr]
    u1 = one(Collector.update, tk2, Update(None, 2, None, None, tup(1, 5)))
    u2 = one(Collector.update, tk2, Update(None, 2, None, None, tup(2, ...)))
    assert tk2.table in u1.reads and not u1.conflicts(u2)


@pytest.mark.parametrize("fires", [False, True])
def test_foreign_keys_of_other_types(fires: bool) -> None:
    """int4 -> int8 values are the same text but not the same binary: not keyed,
    and a barrier only where the target checks it."""
    space = KeySpace()
    rm = mapping("ch", [("id", True), ("k", False)])
    keys = TargetKeys(rm.target.oid, (), (ForeignKey(42, (("k", "k"),), False, fires),))  # type: ignore[union-attr]
    tk = TableKeys.build(rm, keys, space)
    ws = one(Collector.insert, tk, Insert(None, 1, tup(1, 5)))
    assert (ws.barrier is not None) is fires
    assert ws.reads == {tk.table}


def test_trusted_triggers_and_excluded_tables() -> None:
    space = KeySpace()
    rm = mapping("tr", [("id", True)], observed=True)
    keys = TargetKeys(rm.target.oid, (UniqueIndex(("id",), True),))  # type: ignore[union-attr]
    change = Insert(None, 1, tup(1))
    assert one(Collector.insert, TableKeys.build(rm, keys, space), change).barrier is not None
    trusted = one(Collector.insert, TableKeys.build(rm, keys, space, trust_triggers=True), change)
    assert trusted.barrier is None and len(trusted.writes) == 1
    assert one(Collector.insert, TableKeys(), change) == WriteSet()
