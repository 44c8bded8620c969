"""``applier sync-tables``: copy tables added to the publication while ``run`` streams."""

from __future__ import annotations

from pathlib import Path

import click

from .options import config_option, exits_cleanly, load_cfg


@click.command("sync-tables")
@config_option
@click.option(
    "--tables",
    "patterns",
    multiple=True,
    metavar="PATTERN",
    help="Only these tables (schema.table, '*' allowed; may be repeated).",
)
@click.option("--truncate", is_flag=True, help="Empty a non-empty target table before copying.")
@click.option(
    "--timeout",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds to wait for `applier run` to take a caught-up table over.",
)
@click.option("--quiet", is_flag=True, help="No live progress display.")
@click.option(
    "--without-worker",
    is_flag=True,
    help="Copy even though no `applier run` is running; wait --timeout for one to take over.",
)
@exits_cleanly
def sync_tables(
    config_path: Path | None, patterns: tuple[str, ...], truncate: bool, timeout: float,
    quiet: bool, without_worker: bool,
) -> int:  # fmt: skip
    """Copy tables added to the publication while `applier run` streams everything else.

    Each table the target lacks (or whose earlier sync did not finish) is
    created from the source's definition, copied under its own exported
    snapshot (a Spark job, as bootstrap), caught up from its own slot, and
    handed over to the running worker at a transaction boundary; its state is
    in applier.table_sync. Rerun after a crash: it continues where it stopped.

    \b
    Exit codes:
      0  every table copied and handed over (or nothing to copy)
      1  a failure that may pass (a server unreachable), or --timeout passed
         waiting for the worker to take a table over; rerun to continue
      2  bad configuration or usage, a server refuses what the config names
      3  no `applier run` is running to hand over to (checked before any
         copy; --without-worker skips the check), or a table it cannot copy
    """
    from ..extras import require_spark

    require_spark("sync-tables")
    from ..synctables.command import run_sync_tables

    return run_sync_tables(
        load_cfg(config_path), list(patterns), truncate=truncate, timeout=timeout, quiet=quiet,
        without_worker=without_worker,
    )  # fmt: skip
