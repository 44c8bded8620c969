"""Captured DDL replayed by the worker: each kind in place among the rows, streamed and
two-phase, a kill before its commit, refusals stopping with their skip command.

The source side is what ``applier ddl install``'s trigger produces: the real
statement and, in the same source transaction, its ``applier.ddl`` message
(``pg_logical_emit_message(true, 'applier.ddl', ...)``), written here by hand and
signed with the key of the real capture, installed with its event triggers off.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from applykit import ROOT, Runner, wait_equal, wait_for
from conftest import ONE_PAIR, Pair
from psycopg import sql

from applier.ddl import capture
from applier.ddl.message import DdlMessage, DdlObject, signed


def obj(kind: str, identity: str, schema: str | None = "public") -> DdlObject:
    return DdlObject(kind, schema, identity)


def emit(conn: Any, statement: str, tag: str, *objects: DdlObject, path: str = "public") -> None:
    """The message the capture would write, signed with its key (the worker runs no other)."""
    m = DdlMessage(tag, statement, path, tuple(objects))
    conn.execute(
        "SELECT pg_catalog.pg_logical_emit_message(true, 'applier.ddl', %s::bytea)",
        (signed(m.encode(), capture_key(conn.info.dsn)),),
    )


def capture_key(dsn: str) -> bytes:
    """The key of the real capture (``applier ddl install``'s SQL) in the source database,
    installed the first time with its event triggers disabled: these tests write each
    message by hand."""
    with psycopg.connect(dsn, autocommit=False) as c:
        before = capture.state(c)
        if not before.installed:
            capture.install(c, before)
            for name in capture.TRIGGERS.values():
                c.execute(sql.SQL("ALTER EVENT TRIGGER {} DISABLE").format(sql.Identifier(name)))
        row = c.execute("SELECT k FROM applier_ddl.key").fetchone()
        c.commit()
    assert row is not None
    return bytes(row[0])


def txn(pair: Pair, *steps: str | tuple[str, str, tuple[DdlObject, ...]], ran: str = "") -> None:
    """One source transaction: SQL strings run as they are; (statement, tag, objects)
    run ``ran`` or the statement itself, then its message."""
    with pair.pub_conn(autocommit=False) as conn:
        for step in steps:
            if isinstance(step, str):
                conn.execute(step)
            else:
                statement, tag, objects = step
                conn.execute(ran or statement)
                emit(conn, statement, tag, *objects)
        conn.commit()


T = (obj("table", "public.t"),)


def wait_recorded(pair: Pair, runner: Runner, n: int) -> None:
    """Until the worker has run ``n`` captured statements (or it exited: its log)."""

    def done() -> bool:
        assert runner.alive(), runner.log()[-4000:]
        rows = pair.sub_exec(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'applier' "
            "AND tablename = 'schema_changes'"
        )
        return rows == [(1,)] and pair.sub_exec(
            "SELECT count(*) FROM applier.schema_changes WHERE source = 'ddl'"
        ) == [(n,)]

    wait_for(done, 90, f"{n} schema changes")


def columns(query: Any, table: str) -> list[tuple[Any, ...]]:
    return query(
        "SELECT column_name, data_type, column_default FROM information_schema.columns "
        f"WHERE table_name = '{table}' ORDER BY ordinal_position"
    )


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip


def test_each_kind_replayed_in_place_among_rows(any_pair: Pair) -> None:
    pair = any_pair
    pair.both("CREATE TABLE t (id int PRIMARY KEY, a int)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(tables={"include": ["public.*", "app.*"]})
    runner = Runner(pair, cfg).start().ready()
    # A capture on the target (two-way) must see the worker's session as a replication
    # session, and emit nothing back: this trigger (fired in the apply session's
    # replica role too) records what it sees.
    pair.sub_exec(
        "CREATE TABLE seen (tag text, origin_set boolean);"
        "CREATE FUNCTION note() RETURNS event_trigger LANGUAGE plpgsql AS $$BEGIN "
        "INSERT INTO public.seen VALUES (tg_tag, pg_replication_origin_session_is_setup()); "
        "END$$; CREATE EVENT TRIGGER note ON ddl_command_end EXECUTE FUNCTION note();"
        "ALTER EVENT TRIGGER note ENABLE ALWAYS"
    )
    ins = "INSERT INTO t (id, a) VALUES "
    txn(pair, ins + "(1, 1)", ("ALTER TABLE t ADD COLUMN b text DEFAULT 'x'", "ALTER TABLE", T),
        "INSERT INTO t VALUES (2, 2, 'y')")  # fmt: skip
    txn(pair, ins + "(3, 3)", ("ALTER TABLE t RENAME COLUMN b TO c", "ALTER TABLE", T),
        "UPDATE t SET c = 'z' WHERE id = 1")  # fmt: skip
    txn(pair, ("ALTER TABLE t ALTER COLUMN a TYPE bigint", "ALTER TABLE", T),
        "INSERT INTO t VALUES (4, 5000000000, 'w')")  # fmt: skip
    txn(pair, ("ALTER TABLE t ALTER COLUMN a SET DEFAULT 7", "ALTER TABLE", T),
        "INSERT INTO t (id) VALUES (5)",
        ("ALTER TABLE t ADD CONSTRAINT a_pos CHECK (a > 0)", "ALTER TABLE",
         (obj("table constraint", "a_pos on public.t"),)))  # fmt: skip
    idx = (obj("index", "public.t_a"),)
    txn(pair, ("CREATE INDEX CONCURRENTLY t_a ON t (a)", "CREATE INDEX", idx),
        ran="CREATE INDEX t_a ON t (a)")  # fmt: skip
    txn(pair, ("DROP INDEX CONCURRENTLY t_a", "DROP INDEX", idx), ran="DROP INDEX t_a")
    txn(pair, ("ALTER TABLE t DROP COLUMN c", "ALTER TABLE", T), ins + "(6, 6)")
    mood = (obj("type", "public.mood"),)
    txn(pair, ("CREATE TYPE mood AS ENUM ('sad')", "CREATE TYPE", mood),
        ("ALTER TABLE t ADD COLUMN m mood", "ALTER TABLE", T))  # fmt: skip
    txn(pair, ("ALTER TYPE mood ADD VALUE 'happy'", "ALTER TYPE", mood))
    txn(pair, "INSERT INTO t VALUES (7, 7, 'happy')")  # the value, in the next transaction
    seq = (obj("sequence", "public.s"),)
    txn(pair, ("CREATE SEQUENCE s START 100", "CREATE SEQUENCE", seq),
        ("ALTER SEQUENCE s INCREMENT BY 5", "ALTER SEQUENCE", seq))  # fmt: skip
    app = (obj("schema", "app", None),)
    txn(pair, ("CREATE SCHEMA app", "CREATE SCHEMA", app),
        ("CREATE TABLE app.n (id int PRIMARY KEY, v text)", "CREATE TABLE",
         (obj("table", "app.n", "app"),)),
        "INSERT INTO app.n VALUES (1, 'one'), (2, 'two')")  # fmt: skip
    # Temporary objects never stop the worker, nor are replayed.
    with pair.pub_conn(autocommit=False) as conn:
        conn.execute("CREATE TEMP TABLE tmp (x int)")
        emit(conn, "CREATE TEMP TABLE tmp (x int)", "CREATE TABLE")
        emit(conn, "DROP TABLE tmp", "DROP TABLE", obj("table", "pg_temp.tmp", "pg_temp_3"))
        conn.execute("INSERT INTO t VALUES (8, 8)")
        conn.commit()
    wait_recorded(pair, runner, 15)
    wait_equal(pair, ["t", "app.n"], runner=runner, order="id")
    assert columns(pair.sub_exec, "t") == columns(pair.pub_exec, "t")
    assert pair.sub_exec("SELECT conname FROM pg_constraint WHERE conname = 'a_pos'") == [
        ("a_pos",)
    ]
    assert pair.sub_exec("SELECT count(*) FROM pg_class WHERE relname IN ('t_a', 'tmp')") == [(0,)]
    assert pair.sub_exec("SELECT enum_range(NULL::mood)::text") == [("{sad,happy}",)]
    assert pair.sub_exec("SELECT nextval('s'), nextval('s')") == [(100, 105)]
    recorded = pair.sub_exec(
        "SELECT command_tag, statement, source_statement FROM applier.schema_changes "
        "WHERE source = 'ddl' ORDER BY id"
    )
    assert len(recorded) == 15, recorded
    assert (
        "CREATE INDEX",
        "CREATE INDEX t_a ON t (a)",
        "CREATE INDEX CONCURRENTLY t_a ON t (a)",
    ) in recorded
    seen = pair.sub_exec("SELECT origin_set, count(*) FROM seen GROUP BY 1")
    assert seen == [(True, 15)], seen
    assert runner.stop() == 0


@pytest.mark.parametrize("streaming", ["parallel", "on"])
@ONE_PAIR
def test_streamed_transaction_runs_its_ddl_at_its_place(pair: Pair, streaming: str) -> None:
    pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")
    pair.both("CREATE TABLE t (id int PRIMARY KEY, a int)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"streaming": streaming})
    runner = Runner(pair, cfg).start().ready()
    txn(pair, "INSERT INTO t SELECT g, g FROM generate_series(1, 3000) g",
        ("ALTER TABLE t ADD COLUMN b text DEFAULT 'x'", "ALTER TABLE", T),
        "INSERT INTO t SELECT g, g, 'after' FROM generate_series(3001, 6000) g",
        "UPDATE t SET b = 'u' WHERE id % 1000 = 0")  # fmt: skip
    wait_equal(pair, ["t"], runner=runner, order="id")
    assert pair.sub_exec("SELECT count(*) FROM applier.schema_changes") == [(1,)]
    assert runner.stop() == 0


@ONE_PAIR
def test_two_phase_transaction_runs_its_ddl_at_prepare(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY, a int)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply={"two_phase": True})
    runner = Runner(pair, cfg).start().ready()
    with pair.pub_conn(autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (1, 1)")
        conn.execute("ALTER TABLE t ADD COLUMN b text")
        emit(conn, "ALTER TABLE t ADD COLUMN b text", "ALTER TABLE", *T)
        conn.execute("INSERT INTO t VALUES (2, 2, 'b')")
        conn.execute("PREPARE TRANSACTION 'g_ddl'")
    prepared = "SELECT count(*) FROM pg_prepared_xacts"
    wait_for(lambda: pair.sub_exec(prepared) == [(1,)], 60, "the prepared transaction")
    pair.pub_exec("COMMIT PREPARED 'g_ddl'")
    wait_equal(pair, ["t"], runner=runner, order="id")
    assert pair.sub_exec("SELECT count(*) FROM applier.schema_changes") == [(1,)]
    assert runner.stop() == 0


@ONE_PAIR
def test_a_kill_between_the_ddl_and_its_commit_runs_it_once(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE u (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    with pair.sub_conn(autocommit=False) as blocker:
        blocker.execute("INSERT INTO u VALUES (1)")  # the worker's insert waits on it
        add = ("ALTER TABLE t ADD COLUMN b int", "ALTER TABLE", T)
        txn(pair, "INSERT INTO t VALUES (1)", add, "INSERT INTO u VALUES (1)")
        waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
        wait_for(lambda: pair.sub_exec(waiting) == [(1,)], 60, "the worker to wait after its DDL")
        runner.kill()
        blocker.rollback()
    runner = Runner(pair, cfg, "again.log").start().ready()
    wait_equal(pair, ["t", "u"], runner=runner)
    assert columns(pair.sub_exec, "t") == columns(pair.pub_exec, "t")
    assert pair.sub_exec("SELECT count(*) FROM applier.schema_changes") == [(1,)]
    assert runner.stop() == 0


REFUSED = [
    ("ALTER TABLE t ADD c1 int; ALTER TABLE t ADD c2 int", "ALTER TABLE", T, "2 statements"),
    ("CREATE TABLE t2 AS SELECT * FROM t", "CREATE TABLE AS",
     (obj("table", "public.t2"),), "CREATE TABLE AS"),
    ("DROP TABLE t3, x_t", "DROP TABLE", (obj("table", "public.t3"), obj("table", "public.x_t")),
     "excludes (public.x_t)"),
    ("SELECT public.migrate()", "ALTER TABLE", T, "a function or DO block ran ALTER TABLE"),
    ("ALTER TABLE t DROP COLUMN nosuch", "ALTER TABLE", T, 'column "nosuch" of relation'),
]  # fmt: skip


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_refused_and_failing_ddl_stop_with_their_skip_command(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(tables={"exclude": ["public.x_*"]})
    assert Runner(pair, cfg, "slot.log").start().ready().stop() == 0
    for i, (statement, tag, objects, _) in enumerate(REFUSED):
        with pair.pub_conn(autocommit=False) as conn:
            conn.execute("INSERT INTO t VALUES (%s)", (10 * i + 1,))
            emit(conn, statement, tag, *objects)
            conn.execute("INSERT INTO t VALUES (%s)", (10 * i + 2,))
            conn.commit()
    for i, (statement, _, _, says) in enumerate(REFUSED):
        runner = Runner(pair, cfg, f"stop{i}.log").start()
        assert runner.wait(120) == 3, runner.log()[-3000:]
        log = runner.log()
        assert says in log and statement in log, log[-3000:]
        found = re.search(rf"applier skip add --config {re.escape(str(cfg))} --ddl-lsn (\S+)", log)
        assert found is not None, log[-3000:]
        assert pair.sub_exec("SELECT count(*) FROM t") == [(2 * i,)]
        skip = _cli("skip", "add", "--config", str(cfg), "--ddl-lsn", found.group(1).rstrip(")"))
        assert skip.returncode == 0, skip.stderr
    runner = Runner(pair, cfg, "last.log").start().ready()
    wait_equal(pair, ["t"], runner=runner)
    assert runner.stop() == 0
    kept = pair.sub_exec(
        "SELECT op, skipped, statement, table_name FROM applier.skipped_changes ORDER BY id"
    )
    assert [k[2] for k in kept] == [r[0] for r in REFUSED], kept
    assert all(k[0] == "ddl" and k[1] for k in kept)
    assert pair.sub_exec("SELECT count(*) FROM applier.skip_rules WHERE NOT done") == [(0,)]
    dump = _cli("skip", "dump", "--config", str(cfg))
    assert dump.returncode == 0, dump.stderr
    assert "ALTER TABLE t DROP COLUMN nosuch;" in dump.stdout
    assert "set_config('search_path', 'public', true)" in dump.stdout


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_a_non_transactional_message_stops_clearly(pair: Pair) -> None:
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    m = DdlMessage("ALTER TABLE", "ALTER TABLE t ADD c int", "public", T)
    pair.pub_exec(
        "SELECT pg_logical_emit_message(false, 'applier.ddl', '"
        + m.encode().decode().replace("'", "''")
        + "')"
    )
    assert runner.wait(60) == 3
    assert "a non-transactional applier.ddl message" in runner.log()
    assert "--ddl-lsn" in runner.log()


@pytest.mark.spark
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_a_table_added_to_the_publication_is_filled_by_sync_tables(pair: Pair) -> None:
    """CREATE TABLE replayed while the table is not published (the target's copy stays
    empty: its rows are in no stream), then ALTER PUBLICATION ADD TABLE: the worker
    holds its changes and starts sync-tables itself, which copies and hands it over."""
    pair.both("CREATE TABLE a (id int PRIMARY KEY)")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE a")
    cfg = pair.write_config(apply={"timeout": 20.0})
    runner = Runner(pair, cfg).start().ready()
    new = (obj("table", "public.t_new"),)
    txn(pair, "INSERT INTO a VALUES (1)",
        ("CREATE TABLE t_new (id int PRIMARY KEY, v text)", "CREATE TABLE", new),
        "INSERT INTO t_new SELECT g, md5(g::text) FROM generate_series(1, 500) g")  # fmt: skip
    wait_recorded(pair, runner, 1)
    member = (obj("publication relation", "public.t_new in publication pub", None),)
    txn(pair, ("ALTER PUBLICATION pub ADD TABLE t_new", "ALTER PUBLICATION", member),
        "INSERT INTO t_new VALUES (501, 'after')", "INSERT INTO a VALUES (2)")  # fmt: skip
    txn(pair, "UPDATE t_new SET v = 'later' WHERE id <= 10", "INSERT INTO a VALUES (3)")
    wait_for(lambda: "sync-tables started" in runner.log(), 60, "the worker to start sync-tables")
    wait_equal(pair, ["a", "t_new"], timeout=300, runner=runner, order="id")
    wait_for(lambda: "sync-tables done" in runner.log(), 120, "sync-tables to end")
    assert pair.sub_exec("SELECT state FROM applier.table_sync WHERE table_name = 't_new'") in (
        [("syncdone",)],
        [("ready",)],
    )
    txn(pair, "INSERT INTO t_new VALUES (502, 'applied by the worker')")
    wait_equal(pair, ["t_new"], runner=runner, order="id")
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_ddl_from_a_function_when_allowed_runs_the_call_once(pair: Pair) -> None:
    pair.both(
        "CREATE TABLE t (id int PRIMARY KEY); CREATE FUNCTION migrate() RETURNS void "
        "LANGUAGE plpgsql AS $$BEGIN ALTER TABLE public.t ADD COLUMN b int; "
        "ALTER TABLE public.t ADD COLUMN c int; END$$"
    )
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(ddl={"allow_from_functions": True})
    runner = Runner(pair, cfg).start().ready()
    call = ("SELECT public.migrate()", "ALTER TABLE", T)
    with pair.pub_conn(autocommit=False) as conn:
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("SELECT public.migrate()")
        emit(conn, *call[:2], *T)  # one message per statement the function ran
        emit(conn, *call[:2], *T)
        conn.execute("INSERT INTO t VALUES (2, 2, 2)")
        conn.commit()
    has_all = "SELECT count(*) FROM t"
    caught_up = pair.pub_exec(has_all)
    wait_for(lambda: not runner.alive() or pair.sub_exec(has_all) == caught_up, 120, "the rows")
    assert columns(pair.sub_exec, "t") == columns(pair.pub_exec, "t")
    assert runner.stop() == 0


@pytest.mark.parametrize("pair", ["15-18", "18-18"], indirect=True)
def test_with_the_real_capture_ddl_follows_plain_statements(pair: Pair) -> None:
    """`applier ddl install`'s event trigger on the source, statements run as a user
    runs them (autocommit, CONCURRENTLY, a temporary table): the target follows."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, a int)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config()
    installed = _cli("ddl", "install", "--config", str(cfg))
    assert installed.returncode == 0, installed.stderr
    runner = Runner(pair, cfg).start().ready()
    with pair.pub_conn() as conn:  # autocommit: each statement its own transaction
        for statement in (
            "INSERT INTO t VALUES (1, 1)",
            "ALTER TABLE t ADD COLUMN b text DEFAULT 'x'",
            "INSERT INTO t VALUES (2, 2, 'y')",
            "CREATE INDEX CONCURRENTLY t_a ON t (a)",
            "CREATE TYPE mood AS ENUM ('sad')",
            "ALTER TYPE mood ADD VALUE 'happy'",
            "ALTER TABLE t ADD COLUMN m mood",
            "INSERT INTO t VALUES (3, 3, 'z', 'happy')",
            "ALTER TABLE t RENAME COLUMN a TO aa",
            "CREATE TEMP TABLE tmp (x int)",
            "DROP TABLE tmp",
            "CREATE TABLE n (id int PRIMARY KEY, v text)",
            "INSERT INTO n VALUES (1, 'one')",
        ):
            conn.execute(statement)
    has_n = "SELECT count(*) FROM pg_tables WHERE tablename = 'n'"
    wait_for(lambda: not runner.alive() or pair.sub_exec(has_n) == [(1,)], 90, "table n")
    wait_equal(pair, ["t", "n"], runner=runner, order="id")
    assert columns(pair.sub_exec, "t") == columns(pair.pub_exec, "t")
    assert pair.sub_exec("SELECT count(*) FROM pg_indexes WHERE indexname = 't_a'") == [(1,)]
    assert runner.stop() == 0


#: One source transaction with DDL in savepoints rolled back: the DDL first then rows,
#: the DDL alone, rows then the DDL, nested (released inner, rolled-back outer; kept
#: outer, rolled-back inner). ``bulk`` rows go to a table not published: they make the
#: transaction stream (its memory) between the DDL and the rollback while the stream
#: carries nothing of them, so the savepoint's only sent change is the DDL's message.
BULK = "INSERT INTO bulk SELECT g FROM generate_series(1, 4000) g"
SAVEPOINTS = [
    "INSERT INTO t SELECT g, g FROM generate_series(1, 2000) g",
    "SAVEPOINT s1", "ALTER TABLE t ADD COLUMN c1 int",
    "INSERT INTO t SELECT g, g, g FROM generate_series(2001, 3000) g", BULK,
    "ROLLBACK TO SAVEPOINT s1",
    "SAVEPOINT s2", "ALTER TABLE t ADD COLUMN c2 int", BULK, "ROLLBACK TO SAVEPOINT s2",
    "SAVEPOINT s3", "INSERT INTO t SELECT g, g FROM generate_series(3001, 4000) g",
    "ALTER TABLE t ADD COLUMN c3 int", BULK, "ROLLBACK TO SAVEPOINT s3",
    "SAVEPOINT s4", "SAVEPOINT s5", "ALTER TABLE t ADD COLUMN c4 int", BULK,
    "RELEASE SAVEPOINT s5", "ROLLBACK TO SAVEPOINT s4",
    "SAVEPOINT s6", "ALTER TABLE t ADD COLUMN k int DEFAULT 1", "SAVEPOINT s7",
    "ALTER TABLE t ADD COLUMN c5 int", BULK, "ROLLBACK TO SAVEPOINT s7", "RELEASE SAVEPOINT s6",
    "INSERT INTO t SELECT g, g, 2 FROM generate_series(4001, 6000) g",
]  # fmt: skip


@pytest.mark.parametrize(
    ("pair", "streaming"),
    [("15-18", "on"), ("15-18", "parallel"), ("15-18", "off"), ("18-18", "on"),
     ("18-18", "parallel"), ("18-18", "off")],
    indirect=["pair"],
)  # fmt: skip
def test_ddl_in_a_rolled_back_savepoint_is_not_replayed(pair: Pair, streaming: str) -> None:
    """With the real capture: what the source rolled back to a savepoint (the DDL and
    its rows) is not on the target, streamed (``on``, ``parallel``) or not (``off``)."""
    if streaming != "off":
        pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")
    pair.both("CREATE TABLE t (id int PRIMARY KEY, a int)")
    pair.pub_exec("CREATE TABLE bulk (x int); CREATE PUBLICATION pub FOR TABLE t")
    cfg = pair.write_config(apply={"streaming": streaming})
    installed = _cli("ddl", "install", "--config", str(cfg))
    assert installed.returncode == 0, installed.stderr
    runner = Runner(pair, cfg).start().ready()
    with pair.pub_conn(autocommit=False) as conn:
        for statement in SAVEPOINTS:
            conn.execute(statement)
        conn.commit()
    has_all = "SELECT count(*) FROM t"
    caught_up = pair.pub_exec(has_all)
    wait_for(lambda: not runner.alive() or pair.sub_exec(has_all) == caught_up, 120, "the rows")
    assert columns(pair.sub_exec, "t") == columns(pair.pub_exec, "t")
    recorded = pair.sub_exec("SELECT statement FROM applier.schema_changes WHERE source = 'ddl'")
    assert recorded == [("ALTER TABLE t ADD COLUMN k int DEFAULT 1",)], recorded
    wait_equal(pair, ["t"], runner=runner, order="id")
    assert runner.stop() == 0


def _fill_fails(pair: Pair) -> tuple[Path, str, Runner]:
    """A worker whose sync-tables child for the table ALTER PUBLICATION added fails (its
    config unreadable: exit 2); returns the config, its good text and the worker."""
    pair.both(
        "CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE t_new (id int PRIMARY KEY, v text)"
    )
    pair.pub_exec(
        "CREATE PUBLICATION pub FOR TABLE a;"
        "INSERT INTO t_new SELECT g, md5(g::text) FROM generate_series(1, 300) g"
    )
    cfg = pair.write_config(apply={"timeout": 20.0})
    runner = Runner(pair, cfg).start().ready()
    good = cfg.read_text()
    cfg.write_text("[source\n")  # what the worker starts from now on exits 2
    member = (obj("publication relation", "public.t_new in publication pub", None),)
    txn(pair, ("ALTER PUBLICATION pub ADD TABLE t_new", "ALTER PUBLICATION", member),
        "INSERT INTO t_new VALUES (301, 'after')", "INSERT INTO a VALUES (1)")  # fmt: skip
    wait_for(lambda: "sync-tables exited 2" in runner.log(), 120, "the fill to fail")
    return cfg, good, runner


@pytest.mark.spark
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_a_failed_fill_is_started_again(pair: Pair) -> None:
    """A child that fails is started again with a growing wait, the table shown waiting."""
    cfg, good, runner = _fill_fails(pair)
    assert "it is started again in 5 s" in runner.log()
    wait_for(lambda: runner.log().count("sync-tables exited 2") >= 2, 60, "a second try")
    assert "it is started again in 10 s" in runner.log()
    cfg.write_text(good)
    status = _cli("status", "--config", str(cfg))
    assert "public.t_new: waiting for sync-tables" in status.stdout, status.stdout
    wait_equal(pair, ["a", "t_new"], timeout=300, runner=runner, order="id")
    wait_for(lambda: "sync-tables done" in runner.log(), 120, "sync-tables to end")
    assert "t_new" not in _cli("status", "--config", str(cfg)).stdout
    assert runner.stop() == 0


@pytest.mark.spark
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_a_fill_that_never_ran_is_started_again_after_a_restart(pair: Pair) -> None:
    """ALTER PUBLICATION ADD TABLE committed, its sync-tables never ran to the end (here:
    the child fails, its config unreadable, and the worker is killed before any retry):
    the restarted worker starts it again, status says the table waits for it."""
    cfg, good, runner = _fill_fails(pair)
    runner.kill()
    cfg.write_text(good)
    status = _cli("status", "--config", str(cfg))
    assert "public.t_new: waiting for sync-tables" in status.stdout, status.stdout
    runner = Runner(pair, cfg, "again.log").start().ready()
    wait_for(lambda: "sync-tables started" in runner.log(), 60, "the fill to start again")
    wait_equal(pair, ["a", "t_new"], timeout=300, runner=runner, order="id")
    # To its end: the worker stopped while its child finishes would leave the child's
    # origin behind on the cluster the other tests share (their checks count origins).
    wait_for(lambda: "sync-tables done" in runner.log(), 120, "sync-tables to end")
    assert "t_new" not in _cli("status", "--config", str(cfg)).stdout
    assert runner.stop() == 0
