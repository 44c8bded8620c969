"""The ``applier`` command line: parse, load the config, call one layer, map errors to exit codes.

This package holds the click root group (:func:`cli`, :func:`main`; ``python -m
applier.cli`` and the ``applier`` console script both run it) and one module per
command group: :mod:`.run`, :mod:`.bootstrap` (bootstrap, spark-archive),
:mod:`.decode`, :mod:`.status`, :mod:`.skip` (the skip rules' subcommands),
:mod:`.verify`, :mod:`.synctables`, :mod:`.cutover` (cutover, sync-sequences),
:mod:`.drop`, :mod:`.migrate`, :mod:`.demo`, :mod:`.ddl` (DDL capture on the
source). What every command shares (the
--config option, loading the config, errors to exit codes, LSN parameters) is
in :mod:`.options`.

Commands import their layer lazily so ``applier --help`` stays instant and
never starts a JVM. Every :class:`~applier.errors.ApplierError` ends the
command with one logged line on stderr (:func:`applier.log.log_fatal`: a JSON
object with the error's fields in JSON mode) and the error's exit code (``EXIT_*`` in
:mod:`applier.errors`: 1 transient, 2 bad input, 3 a restart will not fix
it); usage errors exit 2 (click's convention). The group's and ``run``'s
``--help`` list the codes.

Imports: the cli sits on top and may import every other package of applier;
no other package imports it. At module level only click, :mod:`.options` and
what it needs (config, configenv, errors, log, lsn); a command imports its
layer (apply, bootstrap, stream, status, skip, verify, ...) inside its body.
"""

from __future__ import annotations

import click

from .. import __version__

# Modules, not their commands: a command named as its module (run, status, ...)
# would shadow the submodule's attribute on this package.
from . import (
    bootstrap,
    cutover,
    ddl,
    decode,
    demo,
    drop,
    migrate,
    run,
    skip,
    status,
    synctables,
    verify,
)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    # Imported here: only --version needs to know (commands import lazily).
    from ..speedups import describe

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


_COMMANDS = (
    run.run, bootstrap.bootstrap, bootstrap.spark_archive, decode.decode, status.status,
    skip.skip, verify.verify, synctables.sync_tables, cutover.cutover, cutover.sync_sequences,
    drop.drop, migrate.migrate, demo.demo, ddl.ddl,
)  # fmt: skip
for _command in _COMMANDS:
    cli.add_command(_command)


def main() -> None:
    cli(prog_name="applier")
