"""The ``applier`` command line: parse, load the config, call one layer, map errors to exit codes.

Commands import their layer lazily so ``applier --help`` stays instant and
never starts a JVM. Every :class:`~applier.errors.ApplierError` ends the
command with one logged line on stderr (:func:`applier.log.log_fatal`: a JSON
object with the error's fields in JSON mode) and the error's exit code (``EXIT_*`` in
:mod:`applier.errors`: 1 transient, 2 bad input, 3 a restart will not fix
it); usage errors exit 2 (click's convention). The group's and ``run``'s
``--help`` list the codes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from . import __version__, configenv
from .config import Config, load_config
from .errors import ApplierError
from .log import log_fatal, setup_logging
from .lsn import Lsn

F = TypeVar("F", bound=Callable[..., Any])

config_option = click.option(
    "--config",
    "config_path",
    envvar="APPLIER_CONFIG",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Path to the applier TOML config (see conf/applier.example.toml); "
    "default: $APPLIER_CONFIG. APPLIER_<SECTION>__<KEY> variables override its keys.",
)


def _load(config_path: Path | None, log_level: str | None = None) -> Config:
    if config_path is None and not any(
        v.startswith(configenv.PREFIX) and v not in configenv.RESERVED for v in os.environ
    ):
        raise click.UsageError(
            "no configuration: pass --config PATH or set APPLIER_CONFIG "
            "(or give every required key as APPLIER_* variables)"
        )
    cfg = load_config(config_path)
    setup_logging(log_level or cfg.logging.level, cfg.logging.format, cfg.logging.journald)
    return cfg


def _exits_cleanly(fn: F) -> F:
    """Turn ApplierError into one logged line (JSON object in JSON mode) and its exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            rc = fn(*args, **kwargs)
        except ApplierError as e:
            log_fatal(e, e.exit_code)
            sys.exit(e.exit_code)
        except KeyboardInterrupt as e:
            log_fatal(e, 130, "interrupted")
            sys.exit(130)
        sys.exit(rc or 0)

    return wrapper  # type: ignore[return-value]


def _lsn(ctx: click.Context, param: click.Parameter, value: str | None) -> Lsn | None:
    if value is None:
        return None
    try:
        return Lsn.parse(value)
    except ApplierError as e:
        raise click.BadParameter(str(e)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="applier")
def cli() -> None:
    """applier: keep one PostgreSQL database replicated into another.

    Bootstrap the target from an exported snapshot (a Spark job), then replay
    the source's logical changes (pgoutput) exactly once.

    \b
    Exit codes (every command):
      0  stopped cleanly
      1  transient failure: a restart may cure it (systemd restarts)
      2  bad configuration or usage, or a missing extra (the error names
         the pip install, e.g. 'applier[spark]' for bootstrap)
      3  stopped on an error a restart will not fix (apply error, slot
         missing, wrong source, unfinished bootstrap): a person must act
    """


@cli.command()
@config_option
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None)
@click.option(
    "--until-lsn",
    callback=_lsn,
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
@_exits_cleanly
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
      1  a failure that may pass (target unreachable at start, a source
         refusal such as a missing publication); systemd restarts it.
         Connection losses while running are retried in-process.
      2  bad configuration or usage
      3  a restart will not fix it: the target refused a change, the slot is
         missing or not applier's, the source is another one, a bootstrap of
         the slot is unfinished; the error line says what to do
    """
    import faulthandler

    from .apply.worker import run_worker

    # systemd's watchdog kills a hung worker with SIGABRT: say where it hung.
    faulthandler.enable()
    if until_lsn is not None and until_caught_up:
        raise click.UsageError("--until-lsn and --until-caught-up exclude each other")
    cfg = _load(config_path, log_level)
    if until_caught_up:
        from .apply.until import current_wal_lsn

        until_lsn = current_wal_lsn(cfg)
    return run_worker(cfg, log_level, until=until_lsn)


@cli.command()
@config_option
@click.option(
    "--recreate-slot", is_flag=True, help="Drop the slot if it exists and create it anew."
)
@click.option("--truncate", is_flag=True, help="Empty non-empty target tables before copying.")
@click.option("--quiet", is_flag=True, help="No live progress display (for services and logs).")
@click.option(
    "--if-needed",
    is_flag=True,
    help="Exit 0 at once when the slot was bootstrapped already (a one-shot job run at "
    "every start, as docker-compose.yml does).",
)
@_exits_cleanly
def bootstrap(
    config_path: Path | None, recreate_slot: bool, truncate: bool, quiet: bool, if_needed: bool
) -> int:
    """Copy the included tables into the target from an exported snapshot (Spark job).

    Creates the slot with an exported snapshot, creates missing tables from the
    source's definitions, copies every table in slices under that snapshot,
    builds indexes and constraints after the data, sets sequences, and sets
    the target's replication origin to the slot's consistent point so that
    `applier run` continues with no gap and no duplicate. Rerun after an
    interruption to continue where it stopped.

    Needs the spark extra (pip install 'applier[spark]') and a Java runtime;
    without them it exits 2 at once and says so.
    """
    from .extras import require_spark

    require_spark("bootstrap")
    from .bootstrap.job import run_bootstrap
    from .errors import AlreadyBootstrapped

    try:
        return run_bootstrap(
            _load(config_path), recreate_slot=recreate_slot, truncate=truncate, quiet=quiet
        )
    except AlreadyBootstrapped as e:
        if not if_needed:
            raise
        click.echo(f"applier: nothing to do: {e.message}", err=True)
        return 0


@cli.command("sync-tables")
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
@_exits_cleanly
def sync_tables(
    config_path: Path | None, patterns: tuple[str, ...], truncate: bool, timeout: float,
    quiet: bool,
) -> int:  # fmt: skip
    """Copy tables added to the publication while `applier run` streams everything else.

    Each table the target lacks (or whose earlier sync did not finish) is
    created from the source's definition, copied under its own exported
    snapshot (a Spark job, as bootstrap), caught up from its own slot, and
    handed over to the running worker at a transaction boundary; its state is
    in applier.table_sync. Rerun after a crash: it continues where it stopped.
    """
    from .extras import require_spark

    require_spark("sync-tables")
    from .synctables.command import run_sync_tables

    return run_sync_tables(
        _load(config_path), list(patterns), truncate=truncate, timeout=timeout, quiet=quiet
    )


@cli.command("spark-archive")
@click.option(
    "--config",
    "config_path",
    envvar="APPLIER_CONFIG",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Config whose [bootstrap] class_archive / spark_conf to use (default: the defaults).",
)
@_exits_cleanly
def spark_archive(config_path: Path | None) -> int:
    """Write the Spark driver's class archive once: later bootstraps start Spark ~2 s sooner.

    Starts Spark with -XX:ArchiveClassesAtExit and runs one task; the JVM
    saves the classes it loaded, parsed and verified. `scripts/setup` runs
    this. Rerun it after upgrading Java or pyspark (a stale archive is
    ignored, never harmful). Needs the spark extra and Java, as bootstrap does.
    """
    from .extras import require_spark

    require_spark("spark-archive")
    from .bootstrap.spark import build_class_archive
    from .config import BootstrapConfig

    if config_path is not None:
        bcfg = _load(config_path).bootstrap
    else:
        setup_logging("info", "text")
        bcfg = BootstrapConfig()
    path = build_class_archive(bcfg)
    click.echo(f"class archive written: {path} ({path.stat().st_size // 2**20} MB)")
    return 0


@cli.command()
@config_option
@click.option("--slot", default=None, help="Slot to read (default: the config's source.slot).")
@click.option(
    "--format", "fmt", type=click.Choice(["json", "text"]), default="json", show_default=True
)
@click.option(
    "--start", callback=_lsn, default=None, help="LSN to start from (default: the slot's)."
)
@click.option("--end", callback=_lsn, default=None, help="Exit once the stream reaches this LSN.")
@_exits_cleanly
def decode(
    config_path: Path | None, slot: str | None, fmt: str, start: Lsn | None, end: Lsn | None
) -> int:
    """Print the decoded change stream, one message per line; never advances the slot."""
    from .stream.decode_cmd import run_decode

    return run_decode(_load(config_path, "warning"), slot=slot, fmt=fmt, start=start, end=end)


@cli.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_exits_cleanly
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
      2  bad configuration or usage
      3  the worker stopped on an error (printed, with what to do)
      4  no worker running, or its heartbeat is stale (older than three
         [apply] status_interval: killed or hung)
      5  the slot is missing or invalidated, or retains more WAL than
         [status] max_retained_wal
    """
    from .status import show_status

    return show_status(_load(config_path, "warning"), as_json=as_json)


@cli.command()
@config_option
@click.option("--slot", is_flag=True, help="The replication slot on the source.")
@click.option("--origin", is_flag=True, help="The replication origin on the target.")
@click.option("--schema", is_flag=True, help="The applier schema on the target.")
@click.option("--yes", is_flag=True, help="Remove them (without it: only print the plan).")
@_exits_cleanly
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
    from .drop import run_drop

    return run_drop(_load(config_path, "warning"), slot=slot, origin=origin, schema=schema, yes=yes)


@cli.group()
def skip() -> None:
    """Skip rules: changes the worker must not apply, and what it kept of them.

    Rules live in the target's applier schema, per replication origin (the
    config's target.origin), and take effect in a running worker within 5 s
    and at every start. Three kinds, one per rule: an object (a table pattern,
    optionally some operations), one transaction (by xid or finish LSN; used
    once, then done), or the changes that fail (optionally only some
    SQLSTATEs). What a rule skips is kept in applier.skipped_changes unless
    --dump none; `applier skip dump` prints it as SQL.

    \b
    Exit codes: 0 done, 1 the target is unreachable, 2 bad usage or no such
    rule (nothing written), 3 the target refused (privileges).
    """


@skip.command("add")
@config_option
@click.option(
    "--table",
    metavar="PATTERN",
    default=None,
    help="schema.table, '*' allowed as in [tables] (e.g. 'public.tmp_*'): an object rule; "
    "with --error, only that table's failing changes.",
)
@click.option(
    "--op",
    "ops",
    metavar="OPS",
    default=None,
    help="Comma-separated: insert,update,delete,truncate (default: all of them).",
)
@click.option(
    "--xid",
    type=click.IntRange(0, 2**32 - 1),
    default=None,
    help="Skip the one transaction with this 32-bit xid, as the apply error prints it.",
)
@click.option(
    "--lsn",
    callback=_lsn,
    default=None,
    help="Skip the one transaction with this finish LSN (as `applier status` prints it).",
)
@click.option("--error", is_flag=True, help="Skip the changes that fail (and only those).")
@click.option(
    "--sqlstate",
    "sqlstates",
    metavar="CODES",
    default=None,
    help="With --error: only failures with these SQLSTATEs, e.g. 23505,23503.",
)
@click.option(
    "--dump",
    type=click.Choice(["none", "skipped", "all"]),
    default=None,
    help="What to keep in applier.skipped_changes: nothing, the skipped changes, or "
    "their whole transaction. Default: all for --xid/--lsn, skipped otherwise.",
)
@_exits_cleanly
def skip_add(
    config_path: Path | None,
    table: str | None,
    ops: str | None,
    xid: int | None,
    lsn: Lsn | None,
    error: bool,
    sqlstates: str | None,
    dump: str | None,
) -> int:
    """Add a skip rule; print its id (only the id, on stdout).

    \b
      skip add --table 'public.tmp_*' [--op ...] [--dump ...]    an object
      skip add --xid 1234 | --lsn 0/1A2B3C4 [--dump ...]          one transaction
      skip add --error [--table P] [--op ...] [--sqlstate ...]   changes that fail

    An identical active rule is not added twice: its id is printed.
    """
    from . import skips

    rule = skips.new_rule(
        table=table, ops=ops, xid=xid, lsn=lsn, error=error, sqlstates=sqlstates, dump=dump
    )
    cfg = _load(config_path, "warning")
    with skips.target(cfg, write=True) as conn:
        rule_id, created = skips.add_rule(conn, cfg.origin, rule)
        past = skips.applied_past(conn, cfg.origin, lsn) if lsn is not None else None
    if not created:
        click.echo(f"applier: an identical active rule exists: {rule_id}", err=True)
    if past is not None:
        click.echo(
            f"applier: warning: origin {cfg.origin} is at {past}, past {lsn}: that "
            "transaction was applied already, so the rule will not match it",
            err=True,
        )
    click.echo(rule_id)
    return 0


@skip.command("list")
@config_option
@click.option("--json", "as_json", is_flag=True, help="A JSON array of rules.")
@click.option(
    "--active", "active_only", is_flag=True, help="Only rules not done (all rules by default)."
)
@_exits_cleanly
def skip_list(config_path: Path | None, as_json: bool, active_only: bool) -> int:
    """List this origin's skip rules, done ones included (unless --active).

    A transaction rule is done once the worker used it (done_at, done_end_lsn);
    object and error rules stay active until removed. "kept" counts the rule's
    rows in applier.skipped_changes.
    """
    from . import skips

    cfg = _load(config_path, "warning")
    with skips.target(cfg, write=False) as conn:
        rules = skips.list_rules(conn, cfg.origin, active_only=active_only)
    skips.render_rules(rules, sys.stdout, origin=cfg.origin, as_json=as_json)
    return 0


@skip.command("remove")
@config_option
@click.argument("rule_id", metavar="ID", type=int)
@_exits_cleanly
def skip_remove(config_path: Path | None, rule_id: int) -> int:
    """Delete rule ID; the changes it kept stay in applier.skipped_changes."""
    from . import skips

    cfg = _load(config_path, "warning")
    with skips.target(cfg, write=True) as conn:
        kept = skips.remove_rule(conn, cfg.origin, rule_id)
    click.echo(f"removed skip rule {rule_id} ({kept} kept change(s) stay)", err=True)
    return 0


@skip.command("dump")
@config_option
@click.option(
    "--xid", type=click.IntRange(0, 2**32 - 1), default=None, help="Only this transaction."
)
@click.option(
    "--lsn", callback=_lsn, default=None, help="Only the transaction with this commit LSN."
)
@click.option(
    "--format", "fmt", type=click.Choice(["sql", "json"]), default="sql", show_default=True
)
@_exits_cleanly
def skip_dump(config_path: Path | None, xid: int | None, lsn: Lsn | None, fmt: str) -> int:
    """Print the kept changes in source commit order, as SQL to review and replay, or JSON.

    SQL: one BEGIN ... COMMIT block per transaction under a comment naming its
    xid, LSNs, commit time, rule and errors. Changes the worker applied and
    kept only for context (--dump all), and values that came in binary, are
    commented out ('-- ' before each line), so that
    `psql -v ON_ERROR_STOP=1 -f dump.sql` replays exactly the skipped changes.
    """
    from . import skipdump, skips

    cfg = _load(config_path, "warning")
    with skips.target(cfg, write=False) as conn:
        changes = skips.kept_changes(conn, cfg.origin, xid=xid, lsn=lsn)
        shapes = skipdump.table_shapes(conn, changes) if fmt == "sql" else {}
    if fmt == "json":
        skipdump.render_json(changes, sys.stdout)
    else:
        skipdump.render_sql(changes, shapes, sys.stdout, origin=cfg.origin)
    return 0


@cli.command()
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
    help="Rows per key range (default: [verify] chunk_rows, 100000).",
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
    "--diff-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the differing rows to this file, one JSON object per line.",
)
@_exits_cleanly
def verify(
    config_path: Path | None,
    patterns: tuple[str, ...],
    chunk_rows: int | None,
    rounds: int,
    as_json: bool,
    diff_out: Path | None,
) -> int:
    """Compare the target with the source, data and schema, while writes go on (Spark job).

    Hashes key ranges inside both servers, narrows differing ranges down to
    the rows that differ (by key, and what each side has), rechecks them in
    later rounds so that rows still in flight are not reported, and compares
    tables, columns, keys, indexes, constraints and sequences.

    \b
    Exit codes:
      0  equal
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
        _load(config_path),
        tables=list(patterns) or None,
        chunk_rows=chunk_rows,
        rounds=rounds,
        as_json=as_json,
        diff_out=diff_out,
    )


@cli.command("sync-sequences")
@config_option
@_exits_cleanly
def sync_sequences(config_path: Path | None) -> int:
    """Copy the current values of the included tables' sequences to the target (at cutover)."""
    from .bootstrap.sequences import sync_sequences as run

    return run(_load(config_path))


@cli.command()
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
@_exits_cleanly
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

    return run_cutover(_load(config_path), timeout=timeout, verify=verify, as_json=as_json)


@cli.command()
@config_option
@_exits_cleanly
def migrate(config_path: Path | None) -> int:
    """Create or upgrade the applier schema on the target (run and bootstrap do this too)."""
    from .schema import upgrade

    upgrade(_load(config_path))
    return 0


@cli.command()
@click.option("--source-version", type=click.Choice(["15", "18"]), default="15", show_default=True)
@click.option("--target-version", type=click.Choice(["15", "18"]), default="18", show_default=True)
@click.option(
    "--rows", type=int, default=200_000, show_default=True, help="Rows in the sample tables."
)
@click.option(
    "--keep", is_flag=True, help="Leave the clusters running and print how to reach them."
)
@_exits_cleanly
def demo(source_version: str, target_version: str, rows: int, keep: bool) -> int:
    """Run applier end to end on two throwaway local clusters (no config needed).

    Needs the demo extra (pip install 'applier[demo]') and a Java runtime.
    """
    from .extras import require_demo

    require_demo()
    from .demo import run_demo

    setup_logging("info")
    return run_demo(int(source_version), int(target_version), rows=rows, keep=keep)


def main() -> None:
    cli(prog_name="applier")


if __name__ == "__main__":
    main()
