"""The applier's own schema on the target, kept by alembic.

``migrations/`` sits at the top of the repository (design card) and ships in
the wheel as ``applier/_migrations``; :func:`migrations_dir` finds whichever
exists. ``run``, ``bootstrap`` and ``migrate`` call :func:`upgrade_target`
first, so a target is always at head before the tool writes to it. Alembic's
version table lives in the ``applier`` schema beside our tables.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import psycopg
from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from .config import Config, redact_dsn
from .errors import ApplierError, ConfigError

log = logging.getLogger(__name__)

SCHEMA = "applier"


def migrations_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if (candidate / "env.py").exists():
            return candidate
    raise ApplierError(
        "applier's migrations are missing from this installation", hint="reinstall applier"
    )


def alembic_config() -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    return cfg


def heads() -> list[str]:
    return list(ScriptDirectory.from_config(alembic_config()).get_heads())


def upgrade_target(conninfo: str) -> None:
    """Bring the target's ``applier`` schema to head (idempotent)."""
    # A creator keeps the conninfo (and any password in it) out of a URL.
    engine = create_engine(
        "postgresql+psycopg://", creator=lambda: _connect(conninfo), poolclass=NullPool
    )
    cfg = alembic_config()
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    finally:
        engine.dispose()
    log.debug("applier schema at head on %s", redact_dsn(conninfo))


def _connect(conninfo: str) -> Any:
    try:
        return psycopg.connect(conninfo)
    except psycopg.OperationalError as e:
        raise ConfigError(
            f"cannot connect to the target ({redact_dsn(conninfo)}): {str(e).strip()}",
            hint="check [target] dsn and that the server is up",
        ) from None


def current_revision(conninfo: str) -> str | None:
    with psycopg.connect(conninfo) as conn:
        exists = conn.execute("SELECT to_regclass('applier.alembic_version')").fetchone()
        if not exists or exists[0] is None:
            return None
        row = conn.execute("SELECT version_num FROM applier.alembic_version").fetchone()
    return row[0] if row else None


def upgrade(cfg: Config) -> None:
    upgrade_target(cfg.target.conninfo())
