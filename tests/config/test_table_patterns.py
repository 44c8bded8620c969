"""``[tables]`` patterns against openGauss's ``white-table-list`` forms (issue 13, item 7).

The reference (``opengauss-decoding-options.zh.txt``, ``white-table-list``):
schema and table separated by ``.``, ``*`` matching anything, e.g.
``public.t1,public.t2,*.t3,my_schema.*``. applier takes the same patterns as a
TOML list (not one comma-separated string); ``*.*`` is the default.
"""

from __future__ import annotations

import pytest

from applier.config import TablesConfig

TABLES = [
    ("public", "t1"),
    ("public", "t2"),
    ("public", "t3"),
    ("public", "t33"),
    ("other", "t3"),
    ("other", "t1"),
    ("my_schema", "a"),
    ("my_schema", "t3"),
    ("my_schemax", "a"),
]


def selected(include: list[str], exclude: list[str] | None = None) -> set[tuple[str, str]]:
    cfg = TablesConfig(include=include, exclude=exclude or [])
    return {t for t in TABLES if cfg.includes(*t)}


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        # schema.table: exactly that table.
        ("public.t1", {("public", "t1")}),
        # *.t3: the table t3 of every schema (not t33).
        ("*.t3", {("public", "t3"), ("other", "t3"), ("my_schema", "t3")}),
        # my_schema.*: every table of that schema (not of my_schemax).
        ("my_schema.*", {("my_schema", "a"), ("my_schema", "t3")}),
    ],
)
def test_each_reference_form(pattern: str, expected: set[tuple[str, str]]) -> None:
    assert selected([pattern]) == expected


def test_the_reference_example_list() -> None:
    got = selected(["public.t1", "public.t2", "*.t3", "my_schema.*"])
    assert got == {
        ("public", "t1"),
        ("public", "t2"),
        ("public", "t3"),
        ("other", "t3"),
        ("my_schema", "a"),
        ("my_schema", "t3"),
    }


def test_default_is_every_table_and_exclude_wins() -> None:
    assert selected(["*.*"]) == set(TABLES)
    assert selected(["*.*"], ["*.t3", "my_schema.*"]) == {
        ("public", "t1"),
        ("public", "t2"),
        ("public", "t33"),
        ("other", "t1"),
        ("my_schemax", "a"),
    }


@pytest.mark.parametrize("bad", ["t3", "public.t1,public.t2", "a.b.c", ".t", "s."])
def test_not_schema_dot_table_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"expected schema\.table"):
        TablesConfig(include=[bad])


def test_star_does_not_cross_the_dot() -> None:
    cfg = TablesConfig(include=["my_schema.*"])
    assert not cfg.includes("my_schema.x", "t")
