"""``applier decode``: print a slot's decoded change stream; never advances the slot.

The reading and printing are :mod:`applier.stream.peek`'s; this module is the command line."""

from __future__ import annotations

from pathlib import Path

import click

from ..lsn import Lsn
from .options import config_option, exits_cleanly, load_cfg, parse_lsn


@click.command()
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
    from ..stream.peek import run_decode

    return run_decode(load_cfg(config_path, "warning"), slot=slot, fmt=fmt, start=start, end=end)
