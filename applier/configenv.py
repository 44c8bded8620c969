"""Config keys from the environment: ``APPLIER_<SECTION>__<KEY>`` overrides.

What a variable means (documented in the README, "Configuration from the
environment"):

* ``APPLIER_CONFIG``: the config file, as ``--config`` (the CLI reads it).
* ``APPLIER_PURE_PYTHON``: run without the C speedups (:mod:`applier.speedups`).
* ``APPLIER_SOURCE_DSN`` / ``APPLIER_TARGET_DSN``: ``source.dsn`` / ``target.dsn``.
* ``APPLIER_<SECTION>__<KEY>``: any key, upper case, ``__`` between the levels
  (``APPLIER_APPLY__GROUP_COMMIT``); a third level reaches into a table-valued
  key (``APPLIER_CONFLICTS__DEFAULT__INSERT_EXISTS``). Table patterns
  (``[conflicts]`` entries other than ``default``) cannot be spelled in a
  variable name: set them in the file, or replace a whole table-valued key with
  an inline table (``APPLIER_CONFLICTS__DEFAULT='{ insert_exists = "skip" }'``).

The value is read as a TOML value when it is one (``42``, ``true``, ``"x"``,
``["a", "b"]``, ``{ k = "v" }``) and as the plain string otherwise, so
``APPLIER_SOURCE__SLOT=app`` and ``APPLIER_SOURCE__SLOT='"app"'`` agree.
The environment wins over the file; a table value replaces the file's table.

A variable with the prefix that names no key is an error (exit 2), never
ignored: a typo must not leave a setting silently at its file value. The
variables applier reads for itself (:data:`RESERVED`) are not overrides.

Why not a settings library (pydantic-settings): it decodes JSON rather than
TOML, skips variables that match no field without a word, and its errors name
the field path rather than the variable; what would remain of it here is
splitting a name on ``__``. This module is that, plus the checks; and
:func:`read_credential`, a systemd credential (``$CREDENTIALS_DIRECTORY``)
named by ``password_credential``.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError

PREFIX = "APPLIER_"
#: Variables applier reads that are not key overrides.
RESERVED = frozenset({"APPLIER_CONFIG", "APPLIER_PURE_PYTHON"})
#: Short names for the keys most often set from the environment.
ALIASES: dict[str, tuple[str, ...]] = {
    "APPLIER_SOURCE_DSN": ("source", "dsn"),
    "APPLIER_TARGET_DSN": ("target", "dsn"),
}


@dataclass(frozen=True)
class Keys:
    """What keys a config has (given by :mod:`applier.config`, which imports this module)."""

    sections: tuple[str, ...]
    #: A section's keys; None where any key goes (``[conflicts]``: table patterns).
    keys_of: Callable[[str], tuple[str, ...] | None]
    #: Whether ``section.key`` takes a table (so a third level reaches into it).
    is_table: Callable[[str, str], bool]


@dataclass(frozen=True)
class Override:
    var: str  # the variable's name, for error messages (never its value: it may be a DSN)
    path: tuple[str, ...]  # the key path in the config, lower case
    value: Any


def env_name(path: tuple[str, ...]) -> str:
    """The variable that sets a key path (``("apply", "group_commit")`` -> APPLIER_APPLY__...)."""
    for var, alias in ALIASES.items():
        if alias == path:
            return var
    return PREFIX + "__".join(p.upper() for p in path)


def parse_value(text: str) -> Any:
    """A TOML value when the text is one, else the text itself."""
    try:
        doc = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    # "1\nother = 2" is valid TOML too, but not one value: keep it a string.
    return doc["v"] if doc.keys() == {"v"} else text


def overrides(environ: Mapping[str, str], schema: Keys) -> list[Override]:
    """The ``APPLIER_*`` variables of ``environ`` as key overrides, checked against ``schema``."""
    out = []
    for var in sorted(environ):
        if not var.startswith(PREFIX) or var in RESERVED:
            continue
        path = ALIASES.get(var) or _split(var)
        problem = _unknown(path, schema)
        if problem:
            raise ConfigError(
                f"{var}: {problem}",
                hint=f"check its spelling: keys are set as {PREFIX}<SECTION>__<KEY> "
                f"(e.g. {PREFIX}APPLY__GROUP_COMMIT), or unset it",
            )
        out.append(Override(var, path, parse_value(environ[var])))
    return out


def apply_overrides(raw: dict[str, Any], found: list[Override]) -> dict[str, Any]:
    """A copy of the file's ``raw`` dict with every override set (the environment wins)."""
    merged = _copy(raw)
    for o in found:
        node = merged
        for part in o.path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[o.path[-1]] = o.value
    return merged


def var_for(loc: tuple[str, ...], found: list[Override]) -> str | None:
    """The variable that set the key at ``loc`` (or a table holding it), if one did."""
    for o in found:
        if loc[: len(o.path)] == o.path:
            return o.var
    return None


def vars_within(loc: tuple[str, ...], found: list[Override]) -> list[str]:
    """The variables that set keys inside the table at ``loc``."""
    return [o.var for o in found if o.path[: len(loc)] == loc]


def _split(var: str) -> tuple[str, ...]:
    return tuple(p.lower() for p in var[len(PREFIX) :].split("__"))


def _unknown(path: tuple[str, ...], schema: Keys) -> str | None:
    """Why ``path`` names no key of ``schema`` (None when it does)."""
    if any(not p for p in path) or len(path) < 2:
        return "not a key override (expected SECTION__KEY, upper case, '__' between levels)"
    section, key, rest = path[0], path[1], path[2:]
    if section not in schema.sections:
        return f"no section [{section}] (sections: {', '.join(schema.sections)})"
    keys = schema.keys_of(section)
    if keys is None:
        return None if len(path) <= 3 else f"too many levels for [{section}]"
    if key not in keys:
        return f"no key {key!r} in [{section}] (keys: {', '.join(keys)})"
    if rest and not (len(rest) == 1 and schema.is_table(section, key)):
        return f"{section}.{key} is not a table"
    return None


def _copy(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def read_credential(name: str) -> str:
    """A systemd credential's content (``LoadCredential=``), stripped of its newline."""
    where = os.environ.get("CREDENTIALS_DIRECTORY")
    hint = (
        f"start applier from a systemd unit with LoadCredential={name}:/path/to/secret "
        "(or use password_file)"
    )
    if not where:
        raise ConfigError(
            f"password_credential {name!r}: $CREDENTIALS_DIRECTORY is not set", hint=hint
        )
    try:
        return (Path(where) / name).read_text().strip()
    except OSError as e:
        raise ConfigError(
            f"password_credential {name!r}: cannot read {Path(where) / name}: {e.strerror}",
            hint=hint,
        ) from None
