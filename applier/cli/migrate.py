"""``applier migrate``: create or upgrade the applier schema on the target."""

from __future__ import annotations

from pathlib import Path

import click

from .options import config_option, exits_cleanly, load_cfg


@click.command()
@config_option
@exits_cleanly
def migrate(config_path: Path | None) -> int:
    """Create or upgrade the applier schema on the target (run and bootstrap do this too)."""
    from ..schema import upgrade

    upgrade(load_cfg(config_path))
    return 0
