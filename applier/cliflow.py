"""The migration workflow's commands: verify, sync-tables, cutover."""

from __future__ import annotations

from pathlib import Path

import click

from .cliutil import config_option, exits_cleanly, load_cfg


@click.command()
@config_option
@click.option(
    "--tables",
    "patterns",
    metavar="PATTERN",
    multiple=True,
    help="Only these tables: schema.table, '*' allowed as in [tables]; repeatable.",
)
@click.option(
    "--chunk-rows",
    type=click.IntRange(min=100),
    default=None,
    help="Rows per key range (default: [verify] chunk_rows, 1000000).",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Times a row must differ, each under a new snapshot, before it is reported.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--strict-sequences",
    is_flag=True,
    help="A sequence behind the source is a difference even while `applier run` replicates "
    "(by default it is reported as not yet synced: sync-sequences copies them at cutover).",
)
@click.option(
    "--diff-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the differing rows to this file, one JSON object per line.",
)
@exits_cleanly
def verify(
    config_path: Path | None,
    patterns: tuple[str, ...],
    chunk_rows: int | None,
    rounds: int,
    as_json: bool,
    strict_sequences: bool,
    diff_out: Path | None,
) -> int:
    """Compare the target with the source, data and schema, while writes go on (Spark job).

    Hashes key ranges inside both servers, narrows differing ranges down to
    the rows that differ (by key, and what each side has), rechecks them in
    later rounds so that rows still in flight are not reported, and compares
    tables, columns, keys, indexes, constraints and sequences.

    While a worker replicates, sequences behind the source are reported as
    not yet synced (sync-sequences copies them at cutover) and do not count
    as differences, unless --strict-sequences.

    \b
    Exit codes:
      0  equal (sequences not yet synced are listed, not counted)
      1  differences found
      2  bad configuration or usage, or the spark extra missing
      3  the verify could not complete (a server, a query or Spark failed)
    """
    from .extras import require_spark

    for p in patterns:
        if p.count(".") != 1 or not all(p.split(".")):
            raise click.BadParameter(f"{p!r}: expected schema.table", param_hint="--tables")
    require_spark("verify")
    from .verify import run_verify

    return run_verify(
        load_cfg(config_path),
        tables=list(patterns) or None,
        chunk_rows=chunk_rows,
        rounds=rounds,
        as_json=as_json,
        diff_out=diff_out,
        strict_sequences=strict_sequences,
    )


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
    from .extras import require_spark

    require_spark("sync-tables")
    from .synctables.command import run_sync_tables

    return run_sync_tables(
        load_cfg(config_path), list(patterns), truncate=truncate, timeout=timeout, quiet=quiet,
        without_worker=without_worker,
    )  # fmt: skip


@click.command()
@config_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    help="Seconds to wait for the target to catch up before giving up (exit 3).",
)
@click.option("--verify", is_flag=True, help="Then compare the tables (one round of verify).")
@click.option("--json", "as_json", is_flag=True, help="The report as one JSON object.")
@exits_cleanly
def cutover(config_path: Path | None, timeout: float, verify: bool, as_json: bool) -> int:
    """Switch to the target, once writes on the source are stopped: catch up, sync sequences.

    Reads the source's current WAL position; waits until the running worker
    has confirmed it, or (no worker running) applies up to it in-process as
    `applier run --until-caught-up` does; copies the sequences' values;
    with --verify compares the tables once. Prints the lag at start, the
    time to catch up, the sequences set, the verify result, and what to do
    next (point the application at the target; how to roll back).

    \b
    Exit codes:
      0  caught up (and equal, with --verify): switch now
      1  caught up, but --verify found differences
      2  bad configuration or usage
      3  could not complete: timeout, the worker stopped on an error, a
         server refused or is unreachable (the report says which)
    """
    from .cutover import run_cutover

    if verify:
        from .extras import require_spark

        require_spark("cutover --verify")  # before catching up, as `verify` itself does
    return run_cutover(load_cfg(config_path), timeout=timeout, verify=verify, as_json=as_json)
