"""The Spark copy: ``applier bootstrap`` and ``applier spark-archive`` (its class archive)."""

from __future__ import annotations

from pathlib import Path

import click

from ..log import setup_logging
from .options import config_option, exits_cleanly, load_cfg


@click.command()
@config_option
@click.option(
    "--recreate-slot", is_flag=True, help="Drop the slot if it exists and create it anew."
)
@click.option("--truncate", is_flag=True, help="Empty non-empty target tables before copying.")
@click.option("--quiet", is_flag=True, help="No live progress display (for services and logs).")
@click.option(
    "--if-needed",
    is_flag=True,
    help="Exit 0 at once when the slot was bootstrapped already (a one-shot job run at "
    "every start, as docker-compose.yml does).",
)
@exits_cleanly
def bootstrap(
    config_path: Path | None, recreate_slot: bool, truncate: bool, quiet: bool, if_needed: bool
) -> int:
    """Copy the included tables into the target from an exported snapshot (Spark job).

    Creates the slot with an exported snapshot, creates missing tables from the
    source's definitions, copies every table in slices under that snapshot,
    builds indexes and constraints after the data, sets sequences, and sets
    the target's replication origin to the slot's consistent point so that
    `applier run` continues with no gap and no duplicate. Rerun after an
    interruption to continue where it stopped.

    Needs the spark extra (pip install 'pg-applier[spark]') and a Java runtime;
    without them it exits 2 at once and says so.
    """
    from ..extras import require_spark

    require_spark("bootstrap")
    from ..bootstrap.job import run_bootstrap
    from ..errors import AlreadyBootstrapped

    try:
        return run_bootstrap(
            load_cfg(config_path), recreate_slot=recreate_slot, truncate=truncate, quiet=quiet
        )
    except AlreadyBootstrapped as e:
        if not if_needed:
            raise
        click.echo(f"applier: nothing to do: {e.message}", err=True)
        return 0


@click.command("spark-archive")
@click.option(
    "--config",
    "config_path",
    envvar="APPLIER_CONFIG",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Config whose [bootstrap] class_archive / spark_conf to use (default: the defaults).",
)
@exits_cleanly
def spark_archive(config_path: Path | None) -> int:
    """Write the Spark driver's class archive once: later bootstraps start Spark ~2 s sooner.

    Starts Spark with -XX:ArchiveClassesAtExit and runs one task; the JVM
    saves the classes it loaded, parsed and verified. `scripts/setup` runs
    this. Rerun it after upgrading Java or pyspark (a stale archive is
    ignored, never harmful). Needs the spark extra and Java, as bootstrap does.
    """
    from ..extras import require_spark

    require_spark("spark-archive")
    from ..bootstrap.spark import build_class_archive
    from ..config import BootstrapConfig

    if config_path is not None:
        bcfg = load_cfg(config_path).bootstrap
    else:
        setup_logging("info", "text")
        bcfg = BootstrapConfig()
    path = build_class_archive(bcfg)
    click.echo(f"class archive written: {path} ({path.stat().st_size // 2**20} MB)")
    return 0
