"""No module of applier imports a ``_private`` name from another package.

What another package needs is public in the module that owns it (a name
without the underscore, documented there), so a reader sees every
dependency between packages in its imports and a private helper can change
without breaking a caller elsewhere. Within one package (the modules of one
directory) private names may be shared. Checked on the source with ``ast``:
``from X import _n``, ``import X._n`` and ``m._n`` where ``m`` names a module
of another package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "applier"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: Path) -> str:
    """The package a source file belongs to: its directory, dotted."""
    return ".".join(path.parent.relative_to(ROOT).parts)


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split("."))
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def _package_of_module(dotted: str) -> str:
    """The package a module belongs to (a package's ``__init__`` to the package itself)."""
    rel = Path(*dotted.split("."))
    return dotted if (ROOT / rel / "__init__.py").is_file() else dotted.rpartition(".")[0]


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = _module_name(path).split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _crossings(path: Path, source: str | None = None) -> Iterator[str]:
    """Each private name module ``path`` (its text ``source``, else read) takes from
    another package, as ``line: what``."""
    here = _package_of(path)
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    modules: dict[str, str] = {}  # local name -> dotted applier module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(path, node)
            if source.split(".")[0] != "applier":
                continue
            for alias in node.names:
                dotted = f"{source}.{alias.name}"
                if _is_module(dotted):  # `from applier.x import module`
                    modules[alias.asname or alias.name] = dotted
                    owner = _package_of_module(dotted) if not _private(alias.name) else source
                else:
                    owner = _package_of_module(source)
                if _private(alias.name) and owner != here:
                    yield f"{node.lineno}: from {source} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] != "applier":
                    continue
                if any(_private(p) for p in parts) and _package_of_module(alias.name) != here:
                    yield f"{node.lineno}: import {alias.name}"
                if alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and _package_of_module(modules[node.value.id]) != here
        ):
            yield f"{node.lineno}: {node.value.id}.{node.attr} ({modules[node.value.id]})"


def test_no_private_name_is_imported_from_another_package() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{where}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for where in _crossings(path)
    ]
    assert not found, (
        "private names taken from another package (make them public in the module that "
        "owns them, or move them to the package that uses them):\n" + "\n".join(found)
    )


def _imported(path: Path) -> Iterator[tuple[int, str]]:
    """Each applier module ``path`` imports (at any depth of its code), with its line."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(path, node)
            for alias in node.names:
                dotted = f"{source}.{alias.name}"
                yield node.lineno, dotted if _is_module(dotted) else source
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)


#: What each feature package's docstring says it must not import (it sits below them).
FORBIDDEN = {
    "applier.skip": ("applier.apply", "applier.stream", "applier.bootstrap", "applier.cli"),
    "applier.status": ("applier.apply", "applier.stream", "applier.bootstrap", "applier.cli"),
}


def test_packages_import_as_their_docstrings_say() -> None:
    """skip/ and status/ import only the package root's modules; only cli/ imports cli/."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _package_of(path)
        banned = FORBIDDEN.get(here, ())
        if not here.startswith("applier.cli"):
            banned = (*banned, "applier.cli")
        for line, dotted in _imported(path):
            if any(dotted == b or dotted.startswith(b + ".") for b in banned):
                found.append(f"{path.relative_to(ROOT)}:{line}: {dotted}")
    assert not found, "imports against the package rule:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from applier.config import _hidden", 1),
        ("from ..config import _hidden", 1),
        ("from ..protocol.tuples import _tuple", 1),
        ("from .planner import _ph", 0),  # same package: allowed
        ("import applier.protocol._speedups", 1),
        ("from applier.protocol import _speedups", 1),
        ("from applier.stream import client\nclient._started", 1),
        ("from ..protocol import decoder\ndecoder._table", 1),
        ("from . import planner\nplanner._ph", 0),
        ("import datetime as _dt\nfrom .planner import compare as _compare", 0),
        ("from applier.protocol import decoder\ndecoder.__doc__", 0),
    ],
)
def test_the_check_sees_each_form(source: str, expected: int) -> None:
    """The walk finds each form it claims to, so its empty answer above means something."""
    assert len(list(_crossings(PACKAGE / "apply" / "probe.py", source))) == expected
