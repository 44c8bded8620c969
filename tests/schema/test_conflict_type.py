"""One ConflictType enum: the config, the policies and the conflict log's CHECK agree."""

from __future__ import annotations

import re

import pytest
from conftest import Pair

from applier.apply.rules import policies
from applier.apply.rules.conflicttype import ConflictType
from applier.config import CONFLICT_POLICIES, DEFAULT_POLICIES
from applier.schema import upgrade_target

NAMES = {t.value for t in ConflictType}

# The CHECK as the migrations make it on an empty target.
pytestmark = pytest.mark.bare_target


def test_the_config_and_the_policies_name_the_enums_types() -> None:
    assert set(CONFLICT_POLICIES) == NAMES == set(DEFAULT_POLICIES)
    short = {
        policies.INSERT_EXISTS, policies.UPDATE_EXISTS, policies.MULTIPLE,
        policies.UPDATE_MISSING, policies.DELETE_MISSING, policies.UPDATE_ORIGIN,
        policies.DELETE_ORIGIN,
    }  # fmt: skip
    assert short == set(ConflictType)


def test_the_enum_is_the_conflict_logs_check_on_a_migrated_target(pair: Pair) -> None:
    upgrade_target(pair.sub_dsn)
    rows = pair.sub_exec(
        "SELECT pg_catalog.pg_get_constraintdef(c.oid) FROM pg_catalog.pg_constraint c "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey) "
        "WHERE c.conrelid = 'applier.conflict_log'::pg_catalog.regclass AND c.contype = 'c' "
        "AND a.attname = 'conflict'"
    )
    assert len(rows) == 1, rows
    (definition,) = rows[0]
    assert set(re.findall(r"'([a-z_]+)'::text", definition)) == NAMES, definition
