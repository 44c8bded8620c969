"""Conflict policies per table: ``[conflicts]`` compiled once per table mapping.

The config names a ``default`` and table patterns (the wildcard syntax of
``[tables]``), each a set of conflict type = policy (PostgreSQL 18's conflict
names; the policies each type takes are in :data:`applier.config.CONFLICT_POLICIES`).
A table takes the entry of the most specific matching pattern (the longest
literal prefix before the first wildcard, then the longer pattern, then the
first written) for the types that entry names, and ``default`` (over the
built-in defaults) for the rest.

What a policy costs is decided here, once per mapping, so the hot path only
reads flags: a table whose policies are the built-in ones
(:attr:`TablePolicy.builtin`) is applied exactly as without any ``[conflicts]``;
rows an UPDATE/DELETE did not find are already seen from the row counts. Only a
non-``error`` policy for an INSERT that meets an existing row, ``apply_remote``
for an UPDATE of a missing row, and a named ``*_origin_differs`` type change the
statements (:mod:`applier.apply.rules.conflicts`); update_exists /
multiple_unique_conflicts of an UPDATE are caught by the careful replay
(savepoints) that runs only after such a failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from applier.apply.rules.conflicttype import ConflictType
from applier.config import DEFAULT_POLICIES, ConflictsConfig, table_matches

# The short names the resolver and the conflict planner use.
INSERT_EXISTS = ConflictType.INSERT_EXISTS
UPDATE_EXISTS = ConflictType.UPDATE_EXISTS
MULTIPLE = ConflictType.MULTIPLE_UNIQUE_CONFLICTS
UPDATE_MISSING = ConflictType.UPDATE_MISSING
DELETE_MISSING = ConflictType.DELETE_MISSING
UPDATE_ORIGIN = ConflictType.UPDATE_ORIGIN_DIFFERS
DELETE_ORIGIN = ConflictType.DELETE_ORIGIN_DIFFERS

_WILD = re.compile(r"[*?\[]")


def specificity(pattern: str) -> tuple[int, int]:
    """How specific a table pattern is: its literal prefix, then its length."""
    m = _WILD.search(pattern)
    return (m.start() if m else len(pattern) + 1, len(pattern))


@dataclass(frozen=True, slots=True)
class TablePolicy:
    """The policy of each conflict type for one table, and what they require."""

    policies: tuple[tuple[str, str], ...]
    #: Origin checks (``*_origin_differs``) are made only where the config names them.
    check_origin: bool

    def __getitem__(self, kind: str) -> str:
        for k, p in self.policies:
            if k == kind:
                return p
        raise KeyError(kind)

    @property
    def builtin(self) -> bool:
        """Every policy is the built-in one: nothing to decide per table."""
        return not self.check_origin and dict(self.policies) == DEFAULT_POLICIES

    @property
    def checked_insert(self) -> bool:
        """INSERTs must see an existing row and decide (not fail): one statement per row."""
        return self[INSERT_EXISTS] != "error"

    @property
    def checked_update(self) -> bool:
        """UPDATEs of a missing row insert it (``update_missing = apply_remote``)."""
        return self[UPDATE_MISSING] == "apply_remote"

    @property
    def catches_unique(self) -> bool:
        """A unique violation of an UPDATE is a conflict to resolve, not an error."""
        return self[UPDATE_EXISTS] != "error" or self[MULTIPLE] != "error"

    @property
    def merge(self) -> bool:
        """Merged UPDATEs give the same final state (not with per-row decisions)."""
        return not (self.checked_update or self.check_origin or self[UPDATE_MISSING] == "error")


class Policies:
    """``[conflicts]`` compiled: :meth:`for_table` gives one table's :class:`TablePolicy`."""

    def __init__(self, cfg: ConflictsConfig) -> None:
        self.default = cfg.default  # over the built-in ones already
        # Most specific first; sorted() is stable, so equal ones keep their order.
        self.patterns = sorted(
            cfg.patterns.items(), key=lambda kv: specificity(kv[0]), reverse=True
        )
        self.default_named = frozenset(cfg.root.get("default", {}))
        self._cache: dict[tuple[str, str], TablePolicy] = {}

    def for_table(self, schema: str, table: str) -> TablePolicy:
        hit = self._cache.get((schema, table))
        if hit is None:
            hit = self._cache[(schema, table)] = self._compile(schema, table)
        return hit

    def _compile(self, schema: str, table: str) -> TablePolicy:
        chosen = dict(self.default)
        named = set(self.default_named)
        for pattern, entry in self.patterns:
            if table_matches(pattern, schema, table):
                chosen.update(entry)
                named |= set(entry)
                break
        origin = bool({UPDATE_ORIGIN, DELETE_ORIGIN} & named)
        return TablePolicy(tuple(sorted(chosen.items())), origin)
