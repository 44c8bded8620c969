"""``applier status``: the slot, the origin, the worker, lag and the health verdict."""

from __future__ import annotations

from pathlib import Path

import click

from .options import config_option, exits_cleanly, load_cfg


@click.command()
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
    from ..status.report import show_status

    return show_status(load_cfg(config_path, "warning"), as_json=as_json)
