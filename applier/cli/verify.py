"""``applier verify``: compare the target with the source while writes go on."""

from __future__ import annotations

from pathlib import Path

import click

from .options import config_option, exits_cleanly, load_cfg


@click.command()
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
    help="Rows per key range (default: [verify] chunk_rows, 1000000).",
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
    "--strict-sequences",
    is_flag=True,
    help="A sequence behind the source is a difference even while `applier run` replicates "
    "(by default it is reported as not yet synced: sync-sequences copies them at cutover).",
)
@click.option(
    "--diff-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the differing rows to this file, one JSON object per line.",
)
@exits_cleanly
def verify(
    config_path: Path | None,
    patterns: tuple[str, ...],
    chunk_rows: int | None,
    rounds: int,
    as_json: bool,
    strict_sequences: bool,
    diff_out: Path | None,
) -> int:
    """Compare the target with the source, data and schema, while writes go on (Spark job).

    Hashes key ranges inside both servers, narrows differing ranges down to
    the rows that differ (by key, and what each side has), rechecks them in
    later rounds so that rows still in flight are not reported, and compares
    tables, columns, keys, indexes, constraints and sequences.

    While a worker replicates, sequences behind the source are reported as
    not yet synced (sync-sequences copies them at cutover) and do not count
    as differences, unless --strict-sequences.

    \b
    Exit codes:
      0  equal (sequences not yet synced are listed, not counted)
      1  differences found
      2  bad configuration or usage, or the spark extra missing
      3  the verify could not complete (a server, a query or Spark failed)
    """
    from ..extras import require_spark

    for p in patterns:
        if p.count(".") != 1 or not all(p.split(".")):
            raise click.BadParameter(f"{p!r}: expected schema.table", param_hint="--tables")
    require_spark("verify")
    from ..verify import run_verify

    return run_verify(
        load_cfg(config_path),
        tables=list(patterns) or None,
        chunk_rows=chunk_rows,
        rounds=rounds,
        as_json=as_json,
        diff_out=diff_out,
        strict_sequences=strict_sequences,
    )
