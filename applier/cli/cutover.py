"""The switch to the target: ``applier cutover`` and ``applier sync-sequences``."""

from __future__ import annotations

from pathlib import Path

import click

from .options import config_option, exits_cleanly, load_cfg


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
    from ..cutover import run_cutover

    if verify:
        from ..extras import require_spark

        require_spark("cutover --verify")  # before catching up, as `verify` itself does
    return run_cutover(load_cfg(config_path), timeout=timeout, verify=verify, as_json=as_json)


@click.command("sync-sequences")
@config_option
@exits_cleanly
def sync_sequences(config_path: Path | None) -> int:
    """Copy the current values of the included tables' sequences to the target (at cutover)."""
    from ..bootstrap.sequences import sync_sequences as run

    return run(load_cfg(config_path))
