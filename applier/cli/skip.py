"""``applier skip``: the skip rules' commands (add, list, remove, dump)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..lsn import Lsn
from .options import config_option, exits_cleanly, load_cfg, parse_lsn


@click.group()
def skip() -> None:
    """Skip rules: changes the worker must not apply, and what it kept of them.

    Rules live in the target's applier schema, per replication origin (the
    config's target.origin), and take effect in a running worker within 2 s
    and at every start. Four kinds, one per rule: an object (a table pattern,
    optionally some operations), one transaction (by xid or finish LSN; used
    once, then done), one captured DDL statement (by its message's LSN; used
    once), or the changes that fail (optionally only some SQLSTATEs). What a
    rule skips is kept in applier.skipped_changes unless --dump none;
    `applier skip dump` prints it as SQL.

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
    callback=parse_lsn,
    default=None,
    help="Skip the one transaction with this finish LSN (as `applier status` prints it).",
)
@click.option(
    "--ddl-lsn",
    callback=parse_lsn,
    default=None,
    help="Skip the one captured DDL statement whose message has this LSN (as the worker's "
    "stop on it prints).",
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
@exits_cleanly
def skip_add(
    config_path: Path | None,
    table: str | None,
    ops: str | None,
    xid: int | None,
    lsn: Lsn | None,
    ddl_lsn: Lsn | None,
    error: bool,
    sqlstates: str | None,
    dump: str | None,
) -> int:
    """Add a skip rule; print its id (only the id, on stdout).

    \b
      skip add --table 'public.tmp_*' [--op ...] [--dump ...]    an object
      skip add --xid 1234 | --lsn 0/1A2B3C4 [--dump ...]          one transaction
      skip add --ddl-lsn 0/1A2B3C4 [--dump none|skipped]         one DDL statement
      skip add --error [--table P] [--op ...] [--sqlstate ...]   changes that fail

    An identical active rule is not added twice: its id is printed.
    """
    from ..skip import store

    rule = store.new_rule(
        table=table,
        ops=ops,
        xid=xid,
        lsn=lsn,
        error=error,
        sqlstates=sqlstates,
        dump=dump,
        ddl_lsn=ddl_lsn,
    )
    cfg = load_cfg(config_path, "warning")
    with store.target(cfg, write=True) as conn:
        rule_id, created = store.add_rule(conn, cfg.origin, rule)
        past = store.applied_past(conn, cfg.origin, lsn) if lsn is not None else None
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
@exits_cleanly
def skip_list(config_path: Path | None, as_json: bool, active_only: bool) -> int:
    """List this origin's skip rules, done ones included (unless --active).

    A transaction rule is done once the worker used it (done_at, done_end_lsn);
    object and error rules stay active until removed. "kept" counts the rule's
    rows in applier.skipped_changes.
    """
    from ..skip import store

    cfg = load_cfg(config_path, "warning")
    with store.target(cfg, write=False) as conn:
        rules = store.list_rules(conn, cfg.origin, active_only=active_only)
    store.render_rules(rules, sys.stdout, origin=cfg.origin, as_json=as_json)
    return 0


@skip.command("remove")
@config_option
@click.argument("rule_id", metavar="ID", type=int)
@exits_cleanly
def skip_remove(config_path: Path | None, rule_id: int) -> int:
    """Delete rule ID; the changes it kept stay in applier.skipped_changes."""
    from ..skip import store

    cfg = load_cfg(config_path, "warning")
    with store.target(cfg, write=True) as conn:
        kept = store.remove_rule(conn, cfg.origin, rule_id)
    click.echo(f"removed skip rule {rule_id} ({kept} kept change(s) stay)", err=True)
    return 0


@skip.command("dump")
@config_option
@click.option(
    "--xid", type=click.IntRange(0, 2**32 - 1), default=None, help="Only this transaction."
)
@click.option(
    "--lsn", callback=parse_lsn, default=None, help="Only the transaction with this commit LSN."
)
@click.option(
    "--format", "fmt", type=click.Choice(["sql", "json"]), default="sql", show_default=True
)
@exits_cleanly
def skip_dump(config_path: Path | None, xid: int | None, lsn: Lsn | None, fmt: str) -> int:
    """Print the kept changes in source commit order, as SQL to review and replay, or JSON.

    SQL: one BEGIN ... COMMIT block per transaction under a comment naming its
    xid, LSNs, commit time, rule and errors. Changes the worker applied and
    kept only for context (--dump all), and values that came in binary, are
    commented out ('-- ' before each line), so that
    `psql -v ON_ERROR_STOP=1 -f dump.sql` replays exactly the skipped changes.
    """
    from ..skip import dump, store

    cfg = load_cfg(config_path, "warning")
    with store.target(cfg, write=False) as conn:
        changes = store.kept_changes(conn, cfg.origin, xid=xid, lsn=lsn)
        shapes = dump.table_shapes(conn, changes) if fmt == "sql" else {}
    if fmt == "json":
        dump.render_json(changes, sys.stdout)
    else:
        dump.render_sql(changes, shapes, sys.stdout, origin=cfg.origin)
    return 0
