"""The ``applier`` command line: parse, load the config, call one layer, map errors to exit codes.

Commands import their layer lazily so ``applier --help`` stays instant and
never starts a JVM. Every :class:`~applier.errors.ApplierError` ends the
command with one logged line on stderr (:func:`applier.log.log_fatal`: a JSON
object with the error's fields in JSON mode) and the error's exit code (``EXIT_*`` in
:mod:`applier.errors`: 1 transient, 2 bad input, 3 a restart will not fix
it); usage errors exit 2 (click's convention). The group's and ``run``'s
``--help`` list the codes. What every command shares is in
:mod:`applier.cliutil`; the skip rules' commands in :mod:`applier.cliskip`,
the migration workflow's (verify, sync-tables, cutover) in :mod:`applier.cliflow`.
"""

from __future__ import annotations

from pathlib import Path

import click

from . import __version__
from .cliflow import cutover, sync_tables, verify
from .cliskip import skip
from .cliutil import config_option, exits_cleanly, load_cfg, parse_lsn
from .log import setup_logging
from .lsn import Lsn


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    # Imported here: only --version needs to know (commands import lazily).
    from .speedups import describe

    click.echo(f"applier, version {__version__} ({describe()})")
    ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version (and whether the C speedups run) and exit.",
)
def cli() -> None:
    """applier: keep one PostgreSQL database replicated into another.

    Bootstrap the target from an exported snapshot (a Spark job), then replay
    the source's logical changes (pgoutput) exactly once.

    \b
    Exit codes (every command):
      0  stopped cleanly
      1  transient failure: a restart may cure it (systemd restarts)
      2  bad configuration or usage, or a missing extra (the error names
         the pip install, e.g. 'pg-applier[spark]' for bootstrap), or a server
         refuses what the config names (password, role, database, publication)
      3  stopped on an error a restart will not fix (apply error, slot
         missing, wrong source, unfinished bootstrap): a person must act
    """


@cli.command()
@config_option
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None)
@click.option(
    "--until-lsn",
    callback=parse_lsn,
    default=None,
    help="Apply every transaction whose commit ends at or before this LSN, none after "
    "it; confirm it to the slot and exit 0.",
)
@click.option(
    "--until-caught-up",
    is_flag=True,
    help="As --until-lsn with the source's current WAL position (pg_current_wal_lsn() "
    "when the command starts).",
)
@exits_cleanly
def run(
    config_path: Path | None, log_level: str | None, until_lsn: Lsn | None, until_caught_up: bool
) -> int:
    """Stream changes from the slot and apply them to the target until stopped.

    Progress is kept in a replication origin on the target, inside each
    applied transaction: after any crash or restart the worker resumes where
    the target's last commit left off, skipping nothing and applying nothing
    twice. SIGTERM/SIGINT stop it cleanly (exit 0).

    Before streaming it checks that no bootstrap of the slot is unfinished,
    that the source is the one the origin was recorded from, and that the slot
    exists (it is created only for an origin without progress) and is a
    logical pgoutput slot of the source database.

    With --until-lsn/--until-caught-up it stops on its own once the target
    has every transaction whose commit record ends at or before the position
    (and none after it), and that position is confirmed to the slot.

    \b
    Exit codes:
      0  stopped by SIGTERM/SIGINT, or the --until position reached
      1  a failure that may pass (a server unreachable or starting up at
         start); systemd restarts it. Connection losses while running are
         retried in-process.
      2  bad configuration or usage, or a server refuses what the config
         names: wrong password, no such role or database, no pg_hba.conf
         line, a publication the source lacks
      3  a restart will not fix it: the target refused a change, the slot is
         missing or not applier's, the source is another one, a bootstrap of
         the slot is unfinished; the error line says what to do
    """
    import faulthandler

    from .apply.worker import run_worker

    # systemd's watchdog kills a hung worker with SIGABRT: say where it hung.
    faulthandler.enable()
    if until_lsn is not None and until_caught_up:
        raise click.UsageError("--until-lsn and --until-caught-up exclude each other")
    cfg = load_cfg(config_path, log_level)
    if until_caught_up:
        from applier.apply.handlers.until import current_wal_lsn

        until_lsn = current_wal_lsn(cfg)
    return run_worker(cfg, log_level, until=until_lsn)


@cli.command()
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
    from .extras import require_spark

    require_spark("bootstrap")
    from .bootstrap.job import run_bootstrap
    from .errors import AlreadyBootstrapped

    try:
        return run_bootstrap(
            load_cfg(config_path), recreate_slot=recreate_slot, truncate=truncate, quiet=quiet
        )
    except AlreadyBootstrapped as e:
        if not if_needed:
            raise
        click.echo(f"applier: nothing to do: {e.message}", err=True)
        return 0


@cli.command("spark-archive")
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
    from .extras import require_spark

    require_spark("spark-archive")
    from .bootstrap.spark import build_class_archive
    from .config import BootstrapConfig

    if config_path is not None:
        bcfg = load_cfg(config_path).bootstrap
    else:
        setup_logging("info", "text")
        bcfg = BootstrapConfig()
    path = build_class_archive(bcfg)
    click.echo(f"class archive written: {path} ({path.stat().st_size // 2**20} MB)")
    return 0


@cli.command()
@config_option
@click.option("--slot", default=None, help="Slot to read (default: the config's source.slot).")
@click.option(
    "--format", "fmt", type=click.Choice(["json", "text"]), default="json", show_default=True
)
@click.option(
    "--start", callback=parse_lsn, default=None, help="LSN to start from (default: the slot's)."
)
@click.option(
    "--end", callback=parse_lsn, default=None, help="Exit once the stream reaches this LSN."
)
@exits_cleanly
def decode(
    config_path: Path | None, slot: str | None, fmt: str, start: Lsn | None, end: Lsn | None
) -> int:
    """Print the decoded change stream, one message per line; never advances the slot."""
    from .stream.decode_cmd import run_decode

    return run_decode(load_cfg(config_path, "warning"), slot=slot, fmt=fmt, start=start, end=end)


@cli.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@exits_cleanly
def status(config_path: Path | None, as_json: bool) -> int:
    """Show the slot, the origin's progress, lag, the worker and its last error.

    Also the conflicts recorded per table, type and resolution, the number of
    active skip rules and, when the worker stopped on a transaction it could
    not apply, the `applier skip add --config F --lsn LSN` that skips it.
    Ends with the health verdict and what to do; --json carries it as
    "code", "health", "reason" and "hint". Fit for a HEALTHCHECK or a probe.

    \b
    Exit codes (status's own; when several hold, the first of 1, 5, 3, 4):
      0  healthy: the worker runs (heartbeat fresh), slot fine
      1  the source or the target is unreachable
      2  bad configuration or usage, or a server refuses what the config
         names (wrong password, no such role or database)
      3  the worker stopped on an error (printed, with what to do)
      4  no worker running, or its heartbeat is stale (older than three
         [apply] status_interval: killed or hung)
      5  the slot is missing or invalidated, or retains more WAL than
         [status] max_retained_wal
    """
    from .status import show_status

    return show_status(load_cfg(config_path, "warning"), as_json=as_json)


@cli.command()
@config_option
@click.option("--slot", is_flag=True, help="The replication slot on the source.")
@click.option("--origin", is_flag=True, help="The replication origin on the target.")
@click.option("--schema", is_flag=True, help="The applier schema on the target.")
@click.option("--yes", is_flag=True, help="Remove them (without it: only print the plan).")
@exits_cleanly
def drop(config_path: Path | None, slot: bool, origin: bool, schema: bool, yes: bool) -> int:
    """Remove what applier created: the slot, the origin, the applier schema.

    None of --slot/--origin/--schema means all three. Without --yes it prints
    what it would remove (and what is absent already) and removes nothing.
    Absent objects are not an error: rerun it to finish an interrupted drop.
    The user's tables are never touched; an applier schema that holds other
    origins' state stays, and only this origin's rows are deleted. An
    unfinished bootstrap does not stop it (its records go; stop a bootstrap
    that still runs first).

    \b
    Exit codes:
      0  removed (or absent); or the plan printed, without --yes
      1  a server is unreachable, or a worker holds the slot or the origin
         or runs: refused, nothing removed
      2  bad configuration or usage
      3  a server refused (privileges)
    """
    from .drop import run_drop

    return run_drop(
        load_cfg(config_path, "warning"), slot=slot, origin=origin, schema=schema, yes=yes
    )


@cli.command("sync-sequences")
@config_option
@exits_cleanly
def sync_sequences(config_path: Path | None) -> int:
    """Copy the current values of the included tables' sequences to the target (at cutover)."""
    from .bootstrap.sequences import sync_sequences as run

    return run(load_cfg(config_path))


@cli.command()
@config_option
@exits_cleanly
def migrate(config_path: Path | None) -> int:
    """Create or upgrade the applier schema on the target (run and bootstrap do this too)."""
    from .schema import upgrade

    upgrade(load_cfg(config_path))
    return 0


@cli.command()
@click.option("--source-version", type=click.Choice(["15", "18"]), default="15", show_default=True)
@click.option("--target-version", type=click.Choice(["15", "18"]), default="18", show_default=True)
@click.option(
    "--rows", type=int, default=200_000, show_default=True, help="Rows in the sample tables."
)
@click.option(
    "--keep", is_flag=True, help="Leave the clusters running and print how to reach them."
)
@exits_cleanly
def demo(source_version: str, target_version: str, rows: int, keep: bool) -> int:
    """Run applier end to end on two throwaway local clusters (no config needed).

    Needs the demo extra (pip install 'pg-applier[demo]') and a Java runtime.
    """
    from .extras import require_demo

    require_demo()
    from .demo import run_demo

    setup_logging("info")
    return run_demo(int(source_version), int(target_version), rows=rows, keep=keep)


for _command in (skip, verify, sync_tables, cutover):
    cli.add_command(_command)


def main() -> None:
    cli(prog_name="applier")


if __name__ == "__main__":
    main()
