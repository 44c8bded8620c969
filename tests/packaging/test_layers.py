"""Which package may import which: the rule ARCHITECTURE.md draws, kept true.

Pure Python: every module of ``applier`` is read with ``ast`` (nothing is
imported), and each ``import`` of another part of applier, at run time or for
type checking alike, must go downwards: a part may import what its row names
(and what those may import, transitively), never its own users. A new edge
upwards is either a design change (move the shared piece down, or hand the
part a Protocol of what it needs) or a change of this table, reviewed.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

APPLIER = Path(__file__).resolve().parents[2] / "applier"

#: The edge's vocabulary: a root module may import the ones listed before it.
BASE = [
    "errors", "lsn", "origingroup", "redact", "configenv", "log", "console", "extras", "lag",
    "refusal", "pgconn", "privileges", "localpg", "largeobjects",
]  # fmt: skip

#: part -> the parts it may import directly (BASE is open to all but ``config``'s
#: own users; what a part may import, it may import transitively).
MAY_IMPORT: dict[str, set[str]] = {
    "config": set(),
    "service": {"config"},
    "speedups": set(),
    "protocol": {"speedups"},
    "stream": {"protocol", "speedups", "config"},
    "schema": {"config", "stream"},
    "status": {"config", "ddl"},
    "ddl": {"config"},
    "skip": {"config", "schema"},
    "apply.sql": {"protocol"},
    "apply.core": {"apply.sql", "protocol"},
    "apply.target": {"apply.core", "apply.sql", "config", "service", "status", "stream"},
    "apply.rules": {"apply.target", "config"},
    "apply.batching": {"apply.rules", "speedups"},
    "apply.handlers": {"apply.batching", "ddl"},
    # Parallel apply: the leader and its members run the handlers' Applier, one
    # per target session; the worker chooses them once at start.
    "apply.parallel": {"apply.handlers", "ddl", "speedups"},
    "apply": {"apply.handlers", "apply.parallel", "schema", "speedups", "status", "stream"},
    "bootstrap": {"apply.target", "apply.sql", "schema", "stream", "config"},
    "verify": {"bootstrap", "config"},
    "synctables": {"apply", "bootstrap", "schema"},
    "cutover": {"apply", "bootstrap", "verify", "status"},
    "drop": {"apply.parallel", "apply.target", "config"},
    "demo": {"bootstrap", "config"},
    "cli": {"apply", "bootstrap", "cutover", "ddl", "demo", "drop", "schema", "skip", "status",
            "stream", "synctables", "verify", "speedups", "config"},
}  # fmt: skip


#: Module-to-module edges against the table, each with its reason. Keep it short.
EXCEPTIONS = {
    # The read loop's Python twin parses the XLogData header with the one Python
    # definition of it (the protocol's), imported lazily: copydata imports no
    # speedups, so no module cycle; C has its own copy in copydata.h.
    ("applier.speedups.takeloop", "applier.protocol.copydata"),
    # The config's policies are keyed by the conflict types: one enum, in a leaf
    # module of the rules that imports nothing of applier.
    ("applier.config", "applier.apply.rules.conflicttype"),
}


def part_of(module: str) -> str:
    """``applier.apply.handlers.dispatch`` -> ``apply.handlers``; a root module is itself;
    the apply package's own modules (the worker process) are ``apply``."""
    parts = module.split(".")[1:]
    if not parts:
        return "applier"
    if parts[0] == "apply" and len(parts) > 1 and (APPLIER / "apply" / parts[1]).is_dir():
        return f"apply.{parts[1]}"
    return parts[0]


def _module_name(path: Path) -> str:
    rel = path.relative_to(APPLIER.parent).with_suffix("")
    name = ".".join(rel.parts)
    return name.removesuffix(".__init__")


def _resolve(node: ast.ImportFrom, here: str, is_pkg: bool) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        pkg = here.split(".") if is_pkg else here.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    # ``from applier.apply import worker`` names a module: take the longest real one.
    out = []
    for alias in node.names:
        full = f"{base}.{alias.name}"
        path = APPLIER.parent / full.replace(".", "/")
        out.append(full if path.with_suffix(".py").exists() or path.is_dir() else base)
    return out


def imports() -> list[tuple[str, str, str]]:
    """(module, imported module, where) of every applier import in applier/."""
    found = []
    for path in sorted(APPLIER.rglob("*.py")):
        here = _module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                targets = _resolve(node, here, path.name == "__init__.py")
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target.startswith("applier.") or target == "applier":
                    found.append(
                        (here, target, f"{path.relative_to(APPLIER.parent)}:{node.lineno}")
                    )
    return found


@cache
def allowed(part: str) -> frozenset[str]:
    """Everything ``part`` may import: itself, BASE below it, its row, transitively."""
    out, todo = {part}, [part]
    while todo:
        p = todo.pop()
        below = set(BASE[: BASE.index(p)]) if p in BASE else {*BASE, "applier"}
        for dep in below | MAY_IMPORT.get(p, set()):
            if dep not in out:
                out.add(dep)
                todo.append(dep)
    return frozenset(out)


def test_the_table_has_no_cycle() -> None:
    """A part never may import, through others, a part that may import it."""
    cycles = [p for p in MAY_IMPORT for q in MAY_IMPORT[p] if p in allowed(q)]
    assert cycles == []


def test_every_import_goes_downwards() -> None:
    upward = [
        f"{where}: {part_of(here)} imports {part_of(target)} ({target})"
        for here, target, where in imports()
        if part_of(target) not in allowed(part_of(here)) and (here, target) not in EXCEPTIONS
    ]
    assert upward == [], "\n".join(upward)


def test_every_part_has_a_row() -> None:
    parts = {part_of(here) for here, _, _ in imports()} - {"applier"}
    assert parts - set(BASE) - set(MAY_IMPORT) == set()


def test_no_part_imports_cli() -> None:
    users = [where for here, target, where in imports()
             if part_of(target) == "cli" and part_of(here) != "cli"]  # fmt: skip
    assert users == []


@pytest.mark.parametrize(
    ("here", "target", "ok"),
    [
        ("applier.apply.sql.planner", "applier.apply.handlers.dispatch", False),
        ("applier.apply.handlers.dispatch", "applier.apply.sql.planner", True),
        ("applier.apply.target.session", "applier.apply.batching.merge", False),
        ("applier.protocol.decoder", "applier.stream.client", False),
        ("applier.lsn", "applier.errors", True),
        ("applier.errors", "applier.lsn", False),
        ("applier.cli.run", "applier.apply.worker", True),
    ],
)
def test_the_rule_itself(here: str, target: str, ok: bool) -> None:
    """The table says no where it should: the check is not vacuous."""
    assert (part_of(target) in allowed(part_of(here))) is ok
