"""The I/O-bound target of issue 36: every applied row change waits about 1 ms.

A target whose tables do not fit in memory spends its apply time waiting for
reads (a random read from a cloud disk is about a millisecond). Simulated
honestly and the same for every consumer: an ENABLE ALWAYS row trigger on each
pgbench table of the *target* sleeps ``sleep_ms`` per row change, but only in a
session with ``session_replication_role = replica``, which both the built-in
apply worker and applier's apply session run with (so the bench's own
preload and resets do not wait, and nothing on the source does). ALWAYS
triggers fire for both; on applier they also send that table's changes one
statement per row (no COPY, no merged UPDATEs), as for any watched table.

Two backlogs (:data:`WORKLOADS`), each from 16 clients:

* ``simple``: pgbench's simple-update script (``-N``: per transaction one
  UPDATE of pgbench_accounts, a SELECT, one INSERT into pgbench_history; so two
  row changes, ~2 ms of waiting): transactions that touch different accounts,
  the independent work parallel apply exists for.
* ``tpcb``: pgbench's default script, full TPC-B (per transaction UPDATEs of
  one account, one teller and one *branch*, a SELECT, one history INSERT; four
  row changes): every transaction writes one of the few branch rows (``scale``
  of them), the hot-row case a parallel applier's keys must serialise.

The trigger touches only its own row (it only sleeps): a parallel applier may
honestly be told to treat these tables as keyed (``[apply] trusted_triggers``;
its write sets make a table with a firing trigger a barrier otherwise):
:func:`trusted_triggers` names them, and parallel_bench.py writes it for
``workers`` > 1.
"""

from __future__ import annotations

from collections.abc import Callable

from .common import Ctx, sh
from .workloads import PGBENCH_TABLES, Workload, pgbench, pgbench_scale

#: Milliseconds each applied row change waits (parallel_bench.py --sleep-ms).
SLEEP_MS = 1.0
#: pgbench clients writing the backlog.
CLIENTS = 16
#: Transactions at --scale 1.
TXNS = 20_000


def _create(ctx: Ctx) -> None:
    for c in (ctx.pub, ctx.sub):
        pgbench(ctx, c, "-i", "-q", "-s", str(pgbench_scale(ctx)), "-I", "dtgvp")
    sh(
        ctx.sub,
        f"""
        CREATE OR REPLACE FUNCTION bench_io_wait() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF pg_catalog.current_setting('session_replication_role') = 'replica' THEN
                PERFORM pg_catalog.pg_sleep({SLEEP_MS / 1000.0});
            END IF;
            RETURN NULL;
        END $$""",
    )
    for t in PGBENCH_TABLES:
        sh(ctx.sub, f"CREATE TRIGGER bench_io_wait AFTER INSERT OR UPDATE OR DELETE ON {t} "
                    f"FOR EACH ROW EXECUTE FUNCTION bench_io_wait(); "
                    f"ALTER TABLE {t} ENABLE ALWAYS TRIGGER bench_io_wait")  # fmt: skip


def txns(ctx: Ctx) -> int:
    return max(CLIENTS, ctx.n(TXNS) // CLIENTS * CLIENTS)


def trusted_triggers() -> str:
    """The ``[apply] trusted_triggers`` line naming the tables that carry the
    bench's trigger (which only sleeps: it touches no row at all)."""
    return "trusted_triggers = [" + ", ".join(f'"public.{t}"' for t in PGBENCH_TABLES) + "]"


def _runner(*script: str) -> Callable[[Ctx], None]:
    def run(ctx: Ctx) -> None:
        pgbench(ctx, ctx.pub, "-n", *script, "-c", str(CLIENTS), "-j", "4",
                "-t", str(txns(ctx) // CLIENTS))  # fmt: skip

    return run


def _workload(name: str, script: tuple[str, ...], what: str) -> Workload:
    return Workload(
        name,
        PGBENCH_TABLES,
        PGBENCH_TABLES[:3],
        _create,
        _runner(*script),
        lambda c: (
            f"{txns(c):,} {what} txns ({CLIENTS} clients, scale {pgbench_scale(c)}), "
            f"target waits {SLEEP_MS:g} ms per row change"
        ),
        keyless=("pgbench_history",),
    )


WORKLOADS = {
    "simple": _workload("simple", ("-N",), "pgbench -N (simple-update)"),
    "tpcb": _workload("tpcb", (), "pgbench TPC-B (hot branch rows)"),
}
