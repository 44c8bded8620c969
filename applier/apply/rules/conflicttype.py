"""The conflict types: one enum, as PostgreSQL's ``ConflictType`` in ``conflict.h``.

PostgreSQL 18's names. The config's ``[conflicts]`` keys
(:data:`applier.config.CONFLICT_POLICIES`), the per-table policies
(:mod:`applier.apply.rules.policies`), the conflict log
(:mod:`applier.apply.rules.conflictlog`, ``applier.conflict_log.conflict``) and the
errors that name a conflict all take them from here. Migration 0006 keeps its own
literal list in the CHECK of ``applier.conflict_log.conflict`` (a released
migration is history, never edited); a test reads that CHECK from a migrated
target and compares it with this enum.

A leaf module (no imports of the applier's): :mod:`applier.config` reads it, and
the policies import the config.
"""

from __future__ import annotations

import enum


class ConflictType(enum.StrEnum):
    """A kind of conflict; its value is the name the config and the log use."""

    INSERT_EXISTS = "insert_exists"
    UPDATE_EXISTS = "update_exists"
    MULTIPLE_UNIQUE_CONFLICTS = "multiple_unique_conflicts"
    UPDATE_MISSING = "update_missing"
    DELETE_MISSING = "delete_missing"
    UPDATE_ORIGIN_DIFFERS = "update_origin_differs"
    DELETE_ORIGIN_DIFFERS = "delete_origin_differs"
