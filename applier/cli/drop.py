"""``applier drop``: remove what applier created (slot, origin, applier schema)."""

from __future__ import annotations

from pathlib import Path

import click

from .options import config_option, exits_cleanly, load_cfg


@click.command()
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
    from ..drop import run_drop

    return run_drop(
        load_cfg(config_path, "warning"), slot=slot, origin=origin, schema=schema, yes=yes
    )
