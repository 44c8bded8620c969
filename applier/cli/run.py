"""``applier run``: stream changes from the slot and apply them to the target."""

from __future__ import annotations

from pathlib import Path

import click

from ..lsn import Lsn
from .options import config_option, exits_cleanly, load_cfg, parse_lsn


@click.command()
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

    from ..apply.process import run_worker

    # systemd's watchdog kills a hung worker with SIGABRT: say where it hung.
    faulthandler.enable()
    if until_lsn is not None and until_caught_up:
        raise click.UsageError("--until-lsn and --until-caught-up exclude each other")
    cfg = load_cfg(config_path, log_level)
    if until_caught_up:
        from applier.apply.handlers.until import current_wal_lsn

        until_lsn = current_wal_lsn(cfg)
    return run_worker(cfg, log_level, until=until_lsn)
