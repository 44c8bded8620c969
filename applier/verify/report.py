"""What ``applier verify`` found, and how it is shown.

* Sequences behind the source while a worker replicates are listed as not
  yet synced (``sync-sequences`` copies them at cutover), not as differences;
  with the strict check (``--strict-sequences``, ``cutover --verify``) they
  are schema differences.
* A rich table per compared table (rows, ranges, differing rows, seconds,
  and a note for tables compared as multisets), then the schema differences
  and the differing rows (the first ones of each table).
* ``--json``: ``{"equal": bool, "tables": [{"table": "schema.name", "rows": N,
  "ranges": N, "keyed": bool, "seconds": S, "truncated": bool, "differences":
  [{"key": {...} | null, "source": {...} | null, "target": {...} | null}, ...]}],
  "schema": [{"kind", "table", "name", "problem", "source", "target"}, ...],
  "sequences_not_synced": [same fields, ...]}``.
  A table without a key has ``"key": null`` and ``source_count`` /
  ``target_count``: how often each side holds that row.
* ``--diff-out FILE``: the differences as JSON lines, one row each, with its
  ``table``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Diff:
    """One row that differs: its key, and what each side has (None: no such row)."""

    table: str
    ident: tuple[str, ...]  # the key's texts (without a key: the row hash)
    key: dict[str, Any] | None
    source: dict[str, Any] | None
    target: dict[str, Any] | None
    source_count: int | None = None  # without a key: copies on each side
    target_count: int | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "source": self.source, "target": self.target}
        if self.key is None:
            out["source_count"] = self.source_count
            out["target_count"] = self.target_count
        return out


@dataclass(frozen=True)
class SchemaDiff:
    kind: str  # table, column, primary key, index, constraint, sequence
    table: str
    name: str
    problem: str
    source: Any = None
    target: Any = None

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "table": self.table,
            "name": self.name,
            "problem": self.problem,
            "source": self.source,
            "target": self.target,
        }


@dataclass
class TableReport:
    table: str
    keyed: bool
    rows: int = 0
    ranges: int = 0
    seconds: float = 0.0
    truncated: bool = False
    differences: list[Diff] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "rows": self.rows,
            "ranges": self.ranges,
            "keyed": self.keyed,
            "seconds": round(self.seconds, 3),
            "truncated": self.truncated,
            "differences": [d.as_json() for d in self.differences],
        }


@dataclass
class Report:
    tables: list[TableReport]
    schema: list[SchemaDiff]
    rounds: int
    seconds: float = 0.0
    lagging: int = 0  # catch-up waits that ran out
    #: Sequences behind the source while a worker replicates: not a difference
    #: (sequences are copied at cutover), unless the check is strict.
    unsynced: list[SchemaDiff] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.schema and not any(t.differences or t.truncated for t in self.tables)

    def differing(self) -> list[str]:
        """The tables that differ, each with how: ``public.t (3 rows)``,
        ``public.u (schema: column c type differs)``; empty when equal."""
        what: dict[str, list[str]] = {}
        for t in self.tables:
            if t.differences or t.truncated:
                n = len(t.differences)
                rows = f"{n}{'+' if t.truncated else ''} row{'' if n == 1 else 's'}"
                what.setdefault(t.table, []).append(rows)
        for d in self.schema:
            what.setdefault(d.table, []).append(f"schema: {d.kind} {d.name} {d.problem}")
        return [f"{table} ({'; '.join(how)})" for table, how in what.items()]

    def as_json(self) -> dict[str, Any]:
        return {
            "equal": self.equal,
            "rounds": self.rounds,
            "seconds": round(self.seconds, 3),
            "tables": [t.as_json() for t in self.tables],
            "schema": [s.as_json() for s in self.schema],
            "sequences_not_synced": [s.as_json() for s in self.unsynced],
        }


def write_diff_lines(report: Report, path: Path) -> None:
    with path.open("w") as f:
        for t in report.tables:
            for d in t.differences:
                f.write(json.dumps({"table": t.table, **d.as_json()}, default=str) + "\n")


def print_json(report: Report) -> None:
    json.dump(report.as_json(), sys.stdout, default=str, indent=2)
    sys.stdout.write("\n")


def schema_lines(diffs: list[SchemaDiff]) -> list[str]:
    """One line per table for its schema differences, each with what either side has:
    ``public.t: column n type differs (source numeric(12,2), target numeric(6,2));
    column d missing on the target (source integer)``. Rows are compared on the
    columns both sides have, so a column added or retyped on one side shows here,
    not as every row differing."""
    by_table: dict[str, list[str]] = {}
    for d in diffs:
        sides = [f"{side} {v}" for side, v in (("source", d.source), ("target", d.target))]
        shown = [x for x, v in zip(sides, (d.source, d.target), strict=True) if v is not None]
        what = f"{d.kind} {d.name} {d.problem}".replace("  ", " ")
        if shown and d.kind in ("column", "primary key", "sequence"):
            what += f" ({', '.join(shown)})"
        by_table.setdefault(d.table, []).append(what)
    return [f"{table}: {'; '.join(whats)}" for table, whats in by_table.items()]


#: Differing rows printed per table in the rich output (all are in --json / --diff-out).
SHOWN = 20


def print_rich(report: Report) -> None:
    from rich.table import Table

    from ..console import console as make_console

    console = make_console()
    grid = Table(title=f"applier verify ({report.rounds} round(s), {report.seconds:.1f} s)")
    for col in ("table", "rows", "ranges", "differing rows", "seconds", "note"):
        grid.add_column(col, justify="right" if col in ("rows", "ranges", "seconds") else "left")
    for t in report.tables:
        n = len(t.differences)
        shown = f"[red]{n}{'+' if t.truncated else ''}[/red]" if n or t.truncated else "0"
        note = "" if t.keyed else "no key: compared as a multiset"
        grid.add_row(t.table, str(t.rows), str(t.ranges), shown, f"{t.seconds:.2f}", note)
    console.print(grid)
    for line in schema_lines(report.schema):
        console.print("[red]schema[/red] ", end="", markup=True)
        console.print(line, markup=False)
    for t in report.tables:
        for d in t.differences[:SHOWN]:
            where = d.key if d.key is not None else "(no key)"
            console.print(f"{t.table} {where}: source={d.source} target={d.target}", markup=False)
        if len(t.differences) > SHOWN:
            console.print(
                f"{t.table}: {len(t.differences) - SHOWN} more (use --json or --diff-out)"
            )
    for s in report.unsynced:
        console.print(
            f"[yellow]sequence[/yellow] {s.name}: not yet synced (next value {s.target} on the "
            f"target, {s.source} on the source): run `applier sync-sequences` at cutover",
            markup=True,
        )
    if report.lagging:
        console.print(
            f"{report.lagging} range(s) were compared before the target caught up "
            "([verify] catchup_timeout); their differences were rechecked"
        )
    console.print("[green]equal[/green]" if report.equal else "[red]differences found[/red]")
