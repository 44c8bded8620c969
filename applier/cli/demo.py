"""``applier demo``: applier end to end on two throwaway local clusters."""

from __future__ import annotations

import click

from ..log import setup_logging
from .options import exits_cleanly


@click.command()
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
    from ..extras import require_demo

    require_demo()
    from ..demo import run_demo

    setup_logging("info")
    return run_demo(int(source_version), int(target_version), rows=rows, keep=keep)
