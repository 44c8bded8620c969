"""pglogical 2 as a third consumer (PostgreSQL 15 only: Debian's postgresql-15-pglogical).

pglogical decodes with its own output plugin into its own slot, which its
``create_subscription`` makes. So the subscription is created before the
workload, left to reach 'replicating', then disabled: its slot then holds the
backlog like the others'. ``drain`` enables it and times until the marker.
Tables with a key go to the ``default`` replication set, insert-only tables
without one (pgbench_history) to ``default_insert_only``; a table with neither
(REPLICA IDENTITY FULL) cannot be replicated by pglogical: reported, skipped.
"""

from __future__ import annotations

import contextlib
import time

from .common import (
    DB,
    ConsumerTimeout,
    Ctx,
    Unsupported,
    log,
    one,
    server_figures,
    sh,
    slot_pid,
    wait_marker,
    wait_until,
    walsender_up,
)  # fmt: skip
from .consumers import Consumer, Figures
from .workloads import Workload

SUB = "pgls"


def setup_nodes(ctx: Ctx) -> None:
    """Once per server pair; sets ``ctx.pglogical_error`` instead of failing the bench."""
    try:
        for c, node in ((ctx.pub, "provider"), (ctx.sub, "subscriber")):
            sh(c, "CREATE EXTENSION IF NOT EXISTS pglogical")
            sh(c, f"SELECT pglogical.create_node(node_name := '{node}', dsn := '{c.dsn(DB)}')")
    except Exception as e:
        ctx.pglogical_error = f"pglogical could not be set up: {e}".strip()
        log(ctx.pglogical_error)


class Pglogical(Consumer):
    key, label = "p", "pglogical"

    def prepare(self, ctx: Ctx, w: Workload, rnd: int) -> None:
        """Whatever goes wrong here is reported and pglogical skipped, not the bench."""
        self.slot = ""
        self.tables: list[tuple[str, str]] = []
        if ctx.pglogical_error:
            raise Unsupported(ctx.pglogical_error)
        try:
            self._prepare(ctx, w)
        except Exception as e:
            self.cleanup(ctx)
            if isinstance(e, Unsupported):
                raise
            raise Unsupported(f"pglogical could not be set up: {e}".strip()) from e

    def _prepare(self, ctx: Ctx, w: Workload) -> None:
        for t in (*w.tables, "marker"):
            rs = "default_insert_only" if t in w.keyless and not w.full_identity else "default"
            try:
                sh(ctx.pub, f"SELECT pglogical.replication_set_add_table('{rs}', '{t}')")
            except Exception as e:  # e.g. no primary key for UPDATE/DELETE
                raise Unsupported(f"pglogical cannot replicate {t}: {e}".strip()) from None
            self.tables.append((rs, t))
        sh(
            ctx.sub,
            f"""SELECT pglogical.create_subscription(
            subscription_name := '{SUB}', provider_dsn := '{ctx.pub.dsn(DB)}',
            replication_sets := ARRAY['default', 'default_insert_only'],
            synchronize_structure := false, synchronize_data := false,
            forward_origins := '{{}}')""",
        )
        wait_until(
            lambda: (
                one(ctx.sub, f"SELECT status FROM pglogical.show_subscription_status('{SUB}')")
                == "replicating"
            ),
            60,
            "the pglogical subscription to replicate",
        )
        self.slot = one(
            ctx.sub, f"SELECT slot_name FROM pglogical.show_subscription_status('{SUB}')"
        )
        sh(ctx.sub, f"SELECT pglogical.alter_subscription_disable('{SUB}', true)")
        wait_until(lambda: slot_pid(ctx.pub, self.slot) is None, 30, "pglogical's slot released")

    def drain(self, ctx: Ctx, marker: int, end_lsn: str, timeout: float) -> Figures:
        t0, wall0 = time.monotonic(), time.time()
        sh(ctx.sub, f"SELECT pglogical.alter_subscription_enable('{SUB}', true)")
        wait_marker(ctx.sub, marker, timeout)
        out: Figures = {"time": time.monotonic() - t0}
        out.update(walsender_up(ctx.pub, self.slot, wall0))
        pids = [p for (p,) in sh(ctx.sub, "SELECT pid FROM pg_stat_activity WHERE backend_type "
                                          "LIKE 'pglogical apply%'")]  # fmt: skip
        out.update(server_figures("apply workers", *pids))
        out.update(server_figures("walsender", slot_pid(ctx.pub, self.slot)))
        return out

    def cleanup(self, ctx: Ctx) -> None:
        with contextlib.suppress(Exception):
            if one(ctx.sub, f"SELECT count(*) FROM pglogical.subscription "
                            f"WHERE sub_name = '{SUB}'"):  # fmt: skip
                sh(ctx.sub, f"SELECT pglogical.drop_subscription('{SUB}')")
        for rs, t in getattr(self, "tables", []):
            with contextlib.suppress(Exception):
                sh(ctx.pub, f"SELECT pglogical.replication_set_remove_table('{rs}', '{t}')")
        if getattr(self, "slot", ""):
            super().cleanup(ctx)  # the slot, if drop_subscription could not drop it


__all__ = ["ConsumerTimeout", "Pglogical", "setup_nodes"]
