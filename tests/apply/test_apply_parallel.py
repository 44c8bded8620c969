"""Parallel apply (issue 36) on real servers: random mixes, commit order, a deadlock.

* **Random mixes** (``workers = 4``, ``two_phase = true``): three writers on the
  source mix rows several writers update (overlapping keys), a unique value
  moved from one row to another in a later transaction (an UPDATE from 'a' to
  a new value, or a DELETE, then another row taking 'a'), parents and children
  in separate transactions (the target's foreign key made ENABLE ALWAYS, so its
  checks fire in the apply sessions), TRUNCATE, columns added on the source
  (``[schema] follow``), streamed transactions (``logical_decoding_work_mem`` =
  64kB) and prepared ones, committed or rolled back. The tables converge equal;
  the metrics show the pool serialised by key and by barrier, and that the keys
  needed no retry (nothing here lies to them).
* **Commit order**: one writer commits transaction i, which inserts row i into
  ``ord`` and touches rows of ``d`` no neighbour touches; on the target ``d``'s
  trusted trigger sleeps a random few ms, so later transactions finish their
  statements before earlier ones. A checker reads the target all along: in one
  snapshot ``ord`` must be a prefix (count = max id) and ``d`` hold exactly
  those transactions' rows.
* **A deadlock on purpose**: a trusted trigger that lies (it updates a shared
  counter row); transaction T1 sleeps in it before taking the counter, T2 (next,
  on other keys) takes it at once and waits for its commit turn, T1 then blocks
  on T2: a cycle PostgreSQL cannot see. The pool must break it.
* **Applied again**: what the keys cannot see (a parent deleted the transaction
  after its children, a child's DELETE not sending its parent) is refused beside
  the earlier transaction and applied again after it, rows of an InsertRun
  included; a run applied again frees its session once.
* **A column followed beside a prepared transaction**: rolled back or committed
  later, it holds nothing and takes nothing away.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from applykit import Runner, table_rows, wait_equal, wait_for
from conftest import Pair
from parkit import (
    apply_section,
    end_target_backends_at_teardown,
    install_change_log,
    metric,
    pool_backends,
    scrape,
    sessions_that_applied,
)

from applier.localpg import free_port

# --- random mixes ----------------------------------------------------------------

MIX_TABLES = {"k": "id", "p": "id", "c": "id", "tr": "id", "big": "id"}
HOT = 10  # k rows 1..HOT: every writer updates them

_MIX = """
CREATE TABLE k (id int PRIMARY KEY, u text UNIQUE, n int NOT NULL DEFAULT 0);
CREATE TABLE p (id int PRIMARY KEY, name text);
CREATE TABLE c (id int PRIMARY KEY, pid int NOT NULL REFERENCES p, v int);
CREATE TABLE tr (id int PRIMARY KEY, v int);
CREATE TABLE big (id int PRIMARY KEY, pad text);
"""

# The foreign key's RI triggers (on c: the check; on p: NO ACTION on delete and
# update) fire in the apply sessions only once they are ENABLE ALWAYS.
_FK_ALWAYS = """
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT t.tgrelid::regclass AS rel, t.tgname FROM pg_catalog.pg_trigger t
            JOIN pg_catalog.pg_constraint k ON k.oid = t.tgconstraint
           WHERE k.conrelid = 'public.c'::regclass AND k.contype = 'f'
  LOOP
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', r.rel, r.tgname);
  END LOOP;
END $$;
"""

Statement = tuple[str, tuple[object, ...]]


@dataclass
class _Model:
    """What writer ``w`` knows of its own rows (only it changes them): the unique
    values of its k rows, its parents, its children and their parents."""

    w: int
    rng: random.Random
    u: dict[int, str] = field(default_factory=dict)
    parents: list[int] = field(default_factory=list)
    children: dict[int, int] = field(default_factory=dict)
    serial: int = 0

    def new_id(self) -> int:
        self.serial += 1
        return self.w * 100_000 + self.serial


#: A transaction: its statements, and what it does to the writer's model once committed.
Txn = tuple[list[Statement], Callable[[], None]]


def _nothing() -> None:
    return None


def _hot(m: _Model) -> Statement:
    return "UPDATE k SET n = n + 1 WHERE id = %s", (m.rng.randint(1, HOT),)


def _moves(m: _Model) -> list[Txn]:
    """A unique value moved: row x gives up 'a' (a new value, or deleted), then, in
    the next transaction, row y takes 'a' (or a new row does)."""
    if len(m.u) < 2:
        x, y = m.new_id(), m.new_id()
        a, b = f"{m.w}-{x}", f"{m.w}-{y}"
        stmts: list[Statement] = [("INSERT INTO k (id, u) VALUES (%s, %s), (%s, %s)", (x, a, y, b))]
        return [(stmts, lambda: m.u.update({x: a, y: b}))]
    x, y = m.rng.sample(sorted(m.u), 2)
    a = m.u[x]
    if m.rng.random() < 0.5:
        fresh = f"{m.w}-{m.new_id()}"
        first: Txn = (
            [("UPDATE k SET u = %s WHERE id = %s", (fresh, x)), _hot(m)],
            lambda: m.u.update({x: fresh}),
        )
        second: Txn = (
            [("UPDATE k SET u = %s WHERE id = %s", (a, y))],
            lambda: m.u.update({y: a}),
        )
        return [first, second]
    z = m.new_id()
    return [
        ([("DELETE FROM k WHERE id = %s", (x,))], lambda: m.u.__delitem__(x)),
        ([("INSERT INTO k (id, u) VALUES (%s, %s)", (z, a))], lambda: m.u.update({z: a})),
    ]


def _family(m: _Model) -> list[Txn]:
    """Parents and children, each change in a transaction of its own."""
    roll = m.rng.random()
    if roll < 0.3 or not m.parents:
        pid = m.new_id()
        return [([("INSERT INTO p VALUES (%s, 'p')", (pid,))], lambda: m.parents.append(pid))]
    if roll < 0.6 or not m.children:
        cid, pid = m.new_id(), m.rng.choice(m.parents)
        return [
            (
                [("INSERT INTO c VALUES (%s, %s, 0)", (cid, pid))],
                lambda: m.children.update({cid: pid}),
            )
        ]
    if roll < 0.8:  # a child moves to another parent
        cid, pid = m.rng.choice(sorted(m.children)), m.rng.choice(m.parents)
        return [
            (
                [("UPDATE c SET pid = %s, v = v + 1 WHERE id = %s", (pid, cid))],
                lambda: m.children.update({cid: pid}),
            )
        ]
    # A parent goes: its children first, it in the next transaction.
    pid = m.rng.choice(m.parents)
    gone = [cid for cid, p in m.children.items() if p == pid]

    def drop_children() -> None:
        for cid in gone:
            m.children.pop(cid)

    return [
        ([("DELETE FROM c WHERE pid = %s", (pid,))], drop_children),
        ([("DELETE FROM p WHERE id = %s", (pid,))], lambda: m.parents.remove(pid)),
    ]


def _streamed(m: _Model) -> list[Txn]:
    """Beyond 64 kB: streamed by the source while it runs."""
    base = m.w * 10_000_000 + m.new_id() % 100_000 * 3000  # ranges of its own
    return [
        (
            [
                (
                    "INSERT INTO big SELECT g, md5(g::text) || md5((g + 1)::text) "
                    "FROM generate_series(%s, %s) g",
                    (base, base + 2500),
                ),
                ("UPDATE big SET pad = 'x' WHERE id BETWEEN %s AND %s", (base, base + 500)),
                ("DELETE FROM big WHERE id BETWEEN %s AND %s", (base + 2000, base + 2500)),
                _hot(m),
            ],
            _nothing,
        )
    ]


def _next(m: _Model) -> tuple[str, list[Txn]]:
    """The kind of the writer's next transactions, and them (one, or two that belong
    together)."""
    roll = m.rng.random()
    if roll < 0.02:
        return "streamed", _streamed(m)
    if roll < 0.05 and m.w == 1:  # one writer: TRUNCATEs of one table never deadlock
        return "truncate", [([("TRUNCATE tr", ()), ("INSERT INTO tr VALUES (0, 0)", ())], _nothing)]
    if roll < 0.3:
        return "moved", _moves(m)
    if roll < 0.55:
        return "family", _family(m)
    stmts = [_hot(m) for _ in range(m.rng.randint(0, 1))]
    for _ in range(m.rng.randint(1, 3)):
        t = m.w * 1000 + m.rng.randint(1, 30)
        stmts.append(
            (
                "INSERT INTO tr VALUES (%s, 1) ON CONFLICT (id) DO UPDATE SET v = tr.v + 1",
                (t,),
            )
        )
    return "overlapping", [(stmts, _nothing)]


def _run(conn: psycopg.Connection[Any], txn: Txn) -> None:
    """Run ``txn``; a source deadlock (TRUNCATE or ALTER TABLE among the writers'
    row locks) rolls it back, and it runs again."""
    stmts, on_commit = txn
    while True:
        try:
            with conn.transaction():
                for query, params in stmts:
                    conn.execute(query, params)
        except psycopg.errors.DeadlockDetected:
            continue
        on_commit()
        return


def _run_prepared(conn: psycopg.Connection[Any], txn: Txn, gid: str, commit: bool) -> None:
    """Run ``txn`` as prepared transaction ``gid``, then commit or roll it back."""
    stmts, on_commit = txn
    conn.autocommit = False  # psycopg's two-phase API needs it off
    while True:
        conn.tpc_begin(gid)
        try:
            for query, params in stmts:
                conn.execute(query, params)
        except psycopg.errors.DeadlockDetected:
            conn.tpc_rollback()
            continue
        conn.tpc_prepare()
        break
    if commit:
        conn.tpc_commit()
        on_commit()
    else:
        conn.tpc_rollback()
    conn.autocommit = True


@dataclass
class _Progress:
    """Transactions each writer (1-3) ran, and how many of each kind were run."""

    done: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    kinds: Counter[str] = field(default_factory=Counter)


def _mix_writer(
    pair: Pair, seed: int, w: int, txns: int, progress: _Progress, errors: list[BaseException]
) -> None:
    m = _Model(w, random.Random(seed * 10 + w))
    try:
        with pair.pub_conn(autocommit=True) as conn:
            columns = sorted(ADD_COLUMNS.items()) if w == 1 else []
            while progress.done[w] < txns:
                if columns and progress.done[w] >= columns[0][0]:
                    _add_column(conn, columns.pop(0)[1])
                    progress.kinds["schema"] += 1
                kind, batch = _next(m)
                progress.kinds[kind] += 1
                for txn in batch:
                    # Prepared: a transaction that stands alone (one of a pair
                    # rolled back would leave the next one invalid on the source).
                    if len(batch) == 1 and m.rng.random() < 0.15:
                        gid = f"mix-{w}-{progress.done[w]}"
                        _run_prepared(conn, txn, gid, commit=m.rng.random() < 0.75)
                        progress.kinds["prepared"] += 1
                    else:
                        _run(conn, txn)
                    progress.done[w] += 1
    except BaseException as e:  # the test thread reports it
        errors.append(e)


#: Columns writer 1 adds on the source when it has run this many transactions;
#: ``[schema] follow`` adds them on the target (a default kept for the old rows, and
#: none).
ADD_COLUMNS = {
    20: "ALTER TABLE k ADD COLUMN extra text DEFAULT 'x'",
    50: "ALTER TABLE c ADD COLUMN note int",
}
# The first change after one may be another writer's, prepared or not (a column
# followed beside a prepared transaction:
# test_a_column_followed_in_a_prepared_transaction_locks_nothing_past_it).


def _add_column(conn: psycopg.Connection[Any], ddl: str) -> None:
    while True:
        try:
            conn.execute(ddl)
            return
        except psycopg.errors.DeadlockDetected:  # its lock against the other writers' rows
            continue


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1])
def test_random_mix_with_four_sessions_converges(any_pair: Pair, seed: int) -> None:
    pair = any_pair
    end_target_backends_at_teardown(pair)
    pair.both(_MIX)
    pair.sub_exec(_FK_ALWAYS)
    pair.pub_exec(f"INSERT INTO k (id, u) SELECT g, 'hot' || g FROM generate_series(1, {HOT}) g")
    pair.sub_exec(f"INSERT INTO k (id, u) SELECT g, 'hot' || g FROM generate_series(1, {HOT}) g")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")
    port = free_port()
    cfg = pair.write_config(
        apply=apply_section(two_phase=True), metrics={"listen": f"127.0.0.1:{port}"}
    )
    runner = Runner(pair, cfg).start().ready()
    errors: list[BaseException] = []
    progress = _Progress()
    threads = [
        threading.Thread(target=_mix_writer, args=(pair, seed, w, 90, progress, errors))
        for w in (1, 2, 3)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    assert not errors, errors
    kinds = ("streamed", "truncate", "moved", "family", "prepared", "schema")
    assert all(progress.kinds[k] for k in kinds), progress.kinds  # the mix held each
    # A Relation message shows an added column with the table's next change: one
    # after the last column added, whatever the writers did after it.
    pair.pub_exec("UPDATE k SET n = n WHERE id = 1; UPDATE c SET v = v")
    for table, order in MIX_TABLES.items():
        wait_equal(pair, [table], timeout=120, runner=runner, order=order)
    assert pair.sub_exec("SELECT count(*) FROM pg_catalog.pg_prepared_xacts") == [(0,)]
    samples = scrape(port)
    assert metric(samples, "applier_apply_sessions") == 4, samples
    assert metric(samples, "applier_apply_serialised_total", reason="key") > 0, samples
    assert metric(samples, "applier_apply_serialised_total", reason="barrier") > 0, samples
    assert len(pool_backends(pair)) == 4
    assert runner.stop() == 0


# A trusted trigger on tr that holds a transaction back before its next statement.
_SLOW_TR = """
CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_catalog.pg_sleep(0.5); RETURN NEW; END $$;
CREATE TRIGGER slow BEFORE UPDATE ON tr FOR EACH ROW EXECUTE FUNCTION public.slow();
ALTER TABLE tr ENABLE ALWAYS TRIGGER slow;
"""


#: What L does besides deleting the parent: nothing, or rows inserted (consecutive
#: Inserts reach the handlers as one InsertRun, which must apply again as it did).
L_ALSO = {
    "alone": "",
    "with_inserts": "; INSERT INTO big SELECT g, 'x' FROM generate_series(1, 5) g",
}


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
@pytest.mark.parametrize("also", sorted(L_ALSO))
def test_a_parent_deleted_after_its_children_is_applied_again_after_them(
    pair: Pair, also: str
) -> None:
    """E deletes a parent's children, L (the next transaction) the parent, with the
    target's foreign key checked (ENABLE ALWAYS). A child's DELETE does not send its
    parent (REPLICA IDENTITY DEFAULT sends the key), so the write sets cannot order
    L after E; E is held back (a trusted trigger on its first row) before it reaches
    the children, so L's check finds them there, unlocked (23503): L is rolled back
    and applied again once E committed, and nothing stops."""
    pair.both(_MIX)
    pair.sub_exec(_FK_ALWAYS + _SLOW_TR)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    port = free_port()
    # group_commit = 1: E and L go to two sessions, never one run.
    cfg = pair.write_config(
        apply=apply_section(trusted_triggers=["public.tr"], group_commit=1),
        metrics={"listen": f"127.0.0.1:{port}"},
    )
    runner = Runner(pair, cfg).start().ready()
    # Every table's Relation message before E and L (a new one makes a barrier).
    pair.pub_exec("INSERT INTO tr VALUES (0, 0); INSERT INTO big VALUES (0, 'x')")
    pair.pub_exec("INSERT INTO p VALUES (1, 'p'), (2, 'p')")
    pair.pub_exec("INSERT INTO c VALUES (1, 1, 0), (2, 1, 0), (3, 2, 0)")
    wait_equal(pair, ["c"], timeout=60, runner=runner)
    pair.pub_exec("UPDATE tr SET v = 1 WHERE id = 0; DELETE FROM c WHERE pid = 1")  # E
    pair.pub_exec("DELETE FROM p WHERE id = 1" + L_ALSO[also])  # L
    pair.pub_exec("UPDATE c SET v = 1 WHERE id = 3")
    for table in ("tr", "p", "c", "big"):
        wait_equal(pair, [table], timeout=60, runner=runner)
    retried = metric(scrape(port), "applier_apply_retried_total")
    assert retried >= 1, runner.log()[-4000:]
    assert "violates foreign key constraint" in runner.log()
    assert runner.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_a_run_applied_again_frees_its_session_once(pair: Pair) -> None:
    """A backlog, so that members take runs of several transactions (group commit in
    the pool): a run holding L (the parent deleted after E deleted its children,
    refused beside E) is applied again one transaction at a time; the member must be
    free once, when the whole run committed, not once per transaction (a member free
    twice is given two runs, and the pool stops moving)."""
    end_target_backends_at_teardown(pair)
    pair.both(_MIX)
    pair.sub_exec(_FK_ALWAYS + _SLOW_TR)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply=apply_section(trusted_triggers=["public.tr"]))
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO tr VALUES (0, 0); INSERT INTO big VALUES (0, 'x')")
    pair.pub_exec("INSERT INTO p SELECT g, 'p' FROM generate_series(1, 8) g")
    pair.pub_exec("INSERT INTO c SELECT g, g, 0 FROM generate_series(1, 8) g")
    wait_equal(pair, ["c"], timeout=60, runner=runner)
    assert runner.stop() == 0
    for n in range(1, 9):  # E_n, L_n and independent ones, queued in the slot
        pair.pub_exec(f"UPDATE tr SET v = {n} WHERE id = 0; DELETE FROM c WHERE pid = {n}")
        pair.pub_exec(f"DELETE FROM p WHERE id = {n}")
        pair.pub_exec(f"INSERT INTO big VALUES ({n}, 'a'); INSERT INTO big VALUES (-{n}, 'b')")
    # Then a transaction that waits for a slow one (a key of tr) while later ones run:
    # it is ready only after them, and must find a session that is really free.
    for n in range(10, 14):
        pair.pub_exec(f"UPDATE tr SET v = {n} WHERE id = 0")
        pair.pub_exec(f"INSERT INTO tr VALUES ({n}, 0)")
        pair.pub_exec(f"UPDATE tr SET v = -{n} WHERE id = 0")
        for k in range(6):
            pair.pub_exec(f"INSERT INTO big VALUES ({n * 100 + k}, 'c')")
    runner = Runner(pair, cfg, "applier-2.log").start()
    for table in ("tr", "p", "c", "big"):
        wait_equal(pair, [table], timeout=60, runner=runner)
    assert "applying transactions again" in runner.log()
    assert runner.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # two-phase: a 15+ source
@pytest.mark.parametrize("workers", [1, 4])
def test_a_column_followed_in_a_prepared_transaction_rolled_back(pair: Pair, workers: int) -> None:
    """A column added on the source; the first change after it is in a prepared
    transaction, so the leader's session follows the column inside it, and ROLLBACK
    PREPARED takes the column away again on the target. The next change of the table
    must find it added again (as with one session), not be refused on a member."""
    pair.both("CREATE TABLE c (id int PRIMARY KEY, v int)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply=apply_section(workers, two_phase=True))
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO c VALUES (1, 0), (2, 0)")
    wait_equal(pair, ["c"], runner=runner)
    pair.pub_exec("ALTER TABLE c ADD COLUMN note int")
    with pair.pub_conn(autocommit=False) as conn:
        conn.tpc_begin("followed")
        conn.execute("UPDATE c SET v = 1 WHERE id = 1")
        conn.tpc_prepare()
        conn.tpc_rollback()
    pair.pub_exec("UPDATE c SET v = 2, note = 5 WHERE id = 2")
    pair.pub_exec("UPDATE c SET v = 3 WHERE id = 1")
    wait_equal(pair, ["c"], timeout=60, runner=runner)
    assert runner.stop() == 0


def _target_rows(pair: Pair, table: str) -> list[str] | None:
    """``table``'s rows on the target, or None while a lock keeps them (2 s at most)."""
    try:
        with pair.sub_conn(autocommit=True) as conn:
            conn.execute("SET lock_timeout = '2s'")
            rows = conn.execute(f"SELECT row_to_json(t)::text FROM {table} t ORDER BY 1")
            return [r[0] for r in rows.fetchall()]
    except psycopg.errors.LockNotAvailable:
        return None


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # two-phase: a 15+ source
@pytest.mark.parametrize("workers", [1, 4])
def test_a_column_followed_in_a_prepared_transaction_locks_nothing_past_it(
    pair: Pair, workers: int
) -> None:
    """The first change after a column added on the source is in a prepared
    transaction, and another transaction changes the table before COMMIT PREPARED (the
    source's prepared transaction holds only its row). The column added on the target
    inside the prepared transaction must not hold the table (ACCESS EXCLUSIVE until
    COMMIT PREPARED): the next transaction would wait for it, and COMMIT PREPARED for
    that one. Reads use a lock timeout, so a stuck target fails the test, not hangs it."""
    end_target_backends_at_teardown(pair)
    pair.both("CREATE TABLE c (id int PRIMARY KEY, v int)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply=apply_section(workers, two_phase=True))
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO c VALUES (1, 0), (2, 0)")
    wait_equal(pair, ["c"], runner=runner)
    pair.pub_exec("ALTER TABLE c ADD COLUMN note int")
    with pair.pub_conn(autocommit=False) as conn:
        conn.tpc_begin("followed")
        conn.execute("UPDATE c SET v = 1 WHERE id = 1")
        conn.tpc_prepare()
        pair.pub_exec("UPDATE c SET v = 2, note = 5 WHERE id = 2")
        conn.tpc_commit()
    src = table_rows(pair.pub_exec, "c")
    wait_for(lambda: _target_rows(pair, "c") == src, 30, "the target's c to equal the source's")
    assert runner.stop() == 0


# --- commit order ------------------------------------------------------------------

ORDER_TXNS = 300


def _order_schema(pair: Pair) -> None:
    pair.both(
        "CREATE TABLE ord (id int PRIMARY KEY); CREATE TABLE d (id int PRIMARY KEY, v bigint);"
        "CREATE SEQUENCE vs"
    )
    # 1-9 ms a row of d, at random: later transactions finish before earlier ones.
    install_change_log(pair, ["d"], "0.001 + pg_catalog.random() * 0.008")
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE ord, d")


def _order_writes(pair: Pair) -> None:
    """Transaction i: row i of ord; d rows 2i and 2i+1 (keys no other transaction
    has); an update of a row transaction i - 40 inserted (a key dependency, which
    the pool waits for if i - 40 is still in flight)."""
    with pair.pub_conn(autocommit=True) as conn:
        for i in range(1, ORDER_TXNS + 1):
            with conn.transaction():
                conn.execute("INSERT INTO ord VALUES (%s)", (i,))
                conn.execute(
                    "INSERT INTO d VALUES (%s, nextval('vs')), (%s, nextval('vs'))",
                    (2 * i, 2 * i + 1),
                )
                if i > 40:
                    conn.execute("UPDATE d SET v = nextval('vs') WHERE id = %s", (2 * (i - 40),))


@dataclass
class _Checker:
    """Reads the target while it applies: (count, max id of ord, rows of d), each
    triple from one statement, so one snapshot."""

    pair: Pair
    seen: list[tuple[int, int, int]] = field(default_factory=list)
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        q = "SELECT count(*), coalesce(max(id), 0), (SELECT count(*) FROM public.d) FROM public.ord"
        try:
            with self.pair.sub_conn(autocommit=True) as conn:
                while not self.stop.is_set():
                    row = conn.execute(q).fetchone()
                    assert row is not None
                    self.seen.append((int(row[0]), int(row[1]), int(row[2])))
                    if row[0] == ORDER_TXNS:
                        return
        except BaseException as e:  # the test thread reports it
            self.error = e


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
@pytest.mark.parametrize("group_commit", [1, 1000])  # one source transaction a commit; default
def test_the_target_never_shows_a_later_transaction_without_an_earlier_one(
    pair: Pair, group_commit: int
) -> None:
    _order_schema(pair)
    cfg = pair.write_config(
        apply=apply_section(trusted_triggers=["public.d"], group_commit=group_commit)
    )
    runner = Runner(pair, cfg).start().ready()
    assert runner.stop() == 0  # the slot exists: the writes below wait in it
    _order_writes(pair)
    checker = _Checker(pair)
    reader = threading.Thread(target=checker.run)
    reader.start()
    runner = Runner(pair, cfg, "applier-2.log").start()
    try:
        wait_equal(pair, ["ord", "d"], timeout=120, runner=runner)
    finally:
        checker.stop.set()
        reader.join(30)
    assert checker.error is None, checker.error
    gaps = [s for s in checker.seen if s[0] != s[1] or s[2] != 2 * s[0]]
    assert gaps == [], f"the target showed a later transaction without an earlier one: {gaps[:10]}"
    middle = {s[0] for s in checker.seen if 0 < s[0] < ORDER_TXNS}
    assert middle, "the checker never saw the target mid-way: it checked nothing"
    assert sessions_that_applied(pair) > 1  # applied in parallel, not one by one
    assert runner.stop() == 0


# --- a deadlock provoked on purpose --------------------------------------------------

# The trigger touches a row that is not its own (the counter) although declared
# trusted: the keys cannot see it. Row 1 sleeps first, so the next transaction
# takes the counter's lock before it.
_LYING_TRIGGER = """
CREATE TABLE counter (id int PRIMARY KEY, n int NOT NULL);
INSERT INTO counter VALUES (1, 0);
CREATE FUNCTION bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.id = 1 THEN PERFORM pg_catalog.pg_sleep(1); END IF;
  UPDATE public.counter SET n = n + 1 WHERE id = 1;
  RETURN NULL;
END $$;
CREATE TRIGGER bump AFTER INSERT OR UPDATE ON t FOR EACH ROW EXECUTE FUNCTION public.bump();
ALTER TABLE t ENABLE ALWAYS TRIGGER bump;
"""


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_a_deadlock_the_keys_miss_is_broken(pair: Pair) -> None:
    """T1 (row 1) sleeps in the trigger; T2 (row 2) takes the counter row and waits for
    its commit turn; T3 (row 3) queues on the counter behind T2, holding the row's
    tuple lock; T1 wakes and queues behind T3. ``pg_blocking_pids(T1)`` names T3 (the
    tuple lock's holder), itself blocked by T2: the later transaction to roll back
    is T2, found through T3. Twice over (rows 1-3 again), all back to back."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)")
    pair.sub_exec(_LYING_TRIGGER)
    pair.pub_exec("CREATE PUBLICATION pub FOR TABLE t")
    port = free_port()
    # group_commit = 1: each source transaction is a target transaction of its own,
    # so T1 and T2 go to two sessions instead of one grouped transaction.
    cfg = pair.write_config(
        apply=apply_section(trusted_triggers=["public.t"], group_commit=1),
        metrics={"listen": f"127.0.0.1:{port}"},
    )
    runner = Runner(pair, cfg).start().ready()
    pair.pub_exec("INSERT INTO t SELECT g, 0 FROM generate_series(1, 3) g")
    changes = 3
    with pair.pub_conn(autocommit=True) as conn:
        for _ in range(2):  # T1 (row 1, sleeps), T2 and T3 (rows 2 and 3) back to back
            for row in (1, 2, 3):
                conn.execute("UPDATE t SET v = v + 1 WHERE id = %s", (row,))
                changes += 1
    wait_equal(pair, ["t"], timeout=120, runner=runner)
    wait_for(
        lambda: pair.sub_exec("SELECT n FROM counter")[0][0] == changes,
        60, f"the counter at {changes}",
    )  # fmt: skip
    assert pair.sub_exec("SELECT n FROM counter") == [(changes,)]
    samples = scrape(port)
    assert metric(samples, "applier_apply_deadlocks_total") >= 1, samples
    assert metric(samples, "applier_apply_retried_total") >= 1, samples
    assert runner.alive(), runner.log()[-4000:]
    assert runner.stop() == 0
