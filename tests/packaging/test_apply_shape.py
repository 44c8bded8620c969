"""The apply engine's shape (issue 32): modules and classes small enough to read, no mixins.

Pure Python, no servers: reads the source of ``applier/apply`` with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

APPLY = Path(__file__).resolve().parents[2] / "applier" / "apply"
#: Lines a module of the engine may have (about 500; split by idea, not by size).
MAX_LINES = 520
#: Methods a class may define.
MAX_METHODS = 30
#: Bases that are not a mixin: a class may have one base besides these (a Protocol
#: may extend several Protocols).
NOT_MIXINS = {"Protocol", "Exception", "Generic", "NamedTuple", "Enum", "StrEnum", "IntEnum"}


def _modules() -> list[tuple[Path, str]]:
    return [(p, p.read_text()) for p in sorted(APPLY.rglob("*.py"))]


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ast.unparse(node)


def test_the_engine_is_there_to_measure() -> None:
    names = {p.relative_to(APPLY).as_posix() for p, _ in _modules()}
    assert {"worker.py", "handlers/dispatch.py", "handlers/changes.py"} <= names


def test_no_module_is_over_the_limit() -> None:
    lines = {p.relative_to(APPLY).as_posix(): src.count("\n") for p, src in _modules()}
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert long == {}


def test_no_class_has_more_methods_than_the_limit() -> None:
    big = {}
    for p, src in _modules():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ClassDef):
                n = sum(isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) for b in node.body)
                if n > MAX_METHODS:
                    big[f"{p.relative_to(APPLY).as_posix()}:{node.name}"] = n
    assert big == {}


def test_no_class_mixes_in_a_second_base() -> None:
    mixed = {}
    for p, src in _modules():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ClassDef):
                bases = [_base_name(b) for b in node.bases]
                # A Protocol made of Protocols is an interface, not a mixin.
                if "Protocol" not in bases and len(set(bases) - NOT_MIXINS) > 1:
                    mixed[f"{p.relative_to(APPLY).as_posix()}:{node.name}"] = bases
    assert mixed == {}
