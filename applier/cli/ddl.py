"""``applier ddl``: schema changes captured on the source (install, uninstall, run)."""

from __future__ import annotations

from pathlib import Path

import click

from .options import config_option, exits_cleanly, load_cfg


@click.group()
def ddl() -> None:
    """Schema changes that follow to the target (README, "Schema changes").

    `install` creates on the source an event trigger that emits each DDL
    statement into the stream, at its place among the changes; `uninstall`
    removes it; `run` runs one statement on the source and emits it, without
    the trigger. Both install and uninstall need a superuser on the source
    (APPLIER_SOURCE__DSN overrides the config's DSN for one run).

    \b
    Exit codes: 0 done, 1 the source is unreachable, 2 bad usage (an empty
    statement, not a schema change), 3 the source refused (not a superuser,
    the statement failed: rolled back).
    """


@ddl.command("install")
@config_option
@click.option(
    "--run-role",
    "run_roles",
    multiple=True,
    metavar="ROLE",
    help="A source role allowed to use applier ddl run (repeatable; superusers always are).",
)
@exits_cleanly
def ddl_install(config_path: Path | None, run_roles: tuple[str, ...]) -> int:
    """Create (or upgrade, or replace) the DDL capture in the source database.

    The schema applier_ddl (with the key that signs each message) and two event
    triggers (ddl_command_end, sql_drop), in one transaction; prints what it did.
    A reinstall keeps the key and the roles granted ddl run.
    """
    from ..ddl import source

    cfg = load_cfg(config_path, "warning")
    click.echo(f"applier: {source.install(cfg, run_roles)}", err=True)
    return 0


@ddl.command("uninstall")
@config_option
@exits_cleanly
def ddl_uninstall(config_path: Path | None) -> int:
    """Remove what `applier ddl install` created (nothing there: says so, exit 0)."""
    from ..ddl import source

    click.echo(f"applier: {source.uninstall(load_cfg(config_path, 'warning'))}", err=True)
    return 0


@ddl.command("run")
@config_option
@click.option(
    "--search-path",
    default=None,
    metavar="PATH",
    help="The search_path the statement runs with (and the target replays it with). "
    "Default: the role's own in that database (ALTER ROLE/DATABASE ... SET), else "
    '"$user", public.',
)
@click.argument("statement")
@exits_cleanly
def ddl_run(config_path: Path | None, search_path: str | None, statement: str) -> int:
    """Run STATEMENT (one DDL statement) on the source and emit it for the target.

    In one source transaction, as pglogical's replicate_ddl_command: the
    statement, then its applier.ddl message; an installed capture does not
    emit it again. A failing statement is rolled back (exit 3).
    """
    from ..ddl import run

    run.check_statement(statement)  # before the config: an empty one is usage
    ran = run.run(load_cfg(config_path, "warning"), statement, search_path)
    if ran.message is None:
        click.echo(
            f"applier: {ran.tag} ran on the source; not emitted: it touched only temporary "
            "objects (or applier's own)",
            err=True,
        )
    else:
        click.echo(f"applier: {ran.tag} ran on the source and was emitted at {ran.lsn}", err=True)
    return 0
