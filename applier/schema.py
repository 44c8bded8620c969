"""The applier's own schema on the target, kept by alembic.

``migrations/`` sits at the top of the repository (design card) and ships in
the wheel as ``applier/_migrations``; :func:`migrations_dir` finds whichever
exists. ``run``, ``bootstrap`` and ``migrate`` call :func:`upgrade_target`
first (after :func:`schema_at_head`), so a target is always at head before the
tool writes to it; both refuse a target older than applier supports
(:func:`applier.stream.versions.check_target`), so that is one line at start.
Alembic's version table lives in the ``applier`` schema beside our tables.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from . import pgconn
from .config import Config
from .errors import ApplierError, ConfigError, ConnectionLost, PermanentError
from .redact import redact_dsn
from .stream.versions import check_target

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

# alembic and SQLAlchemy are imported only where a migration really runs:
# `applier run` checks schema_at_head() first and usually skips them (start-up).
log = logging.getLogger(__name__)

SCHEMA = "applier"


def migrations_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if (candidate / "env.py").exists():
            return candidate
    raise ApplierError(
        "applier's migrations are missing from this installation", hint="reinstall pg-applier"
    )


def alembic_config() -> AlembicConfig:
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    return cfg


def heads() -> list[str]:
    from alembic.script import ScriptDirectory

    return list(ScriptDirectory.from_config(alembic_config()).get_heads())


def script_head() -> str | None:
    """The single head of the shipped migrations, read from the files without alembic.

    None when it cannot tell (then callers fall back to running alembic).
    """
    revs: set[str] = set()
    downs: set[str] = set()
    for f in (migrations_dir() / "versions").glob("*.py"):
        text = f.read_text()
        rev = re.search(r"^revision\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        down = re.search(r"^down_revision\s*(?::[^=]*)?=\s*(.*)$", text, re.M)
        if rev is None or down is None:
            return None
        revs.add(rev.group(1))
        downs.update(re.findall(r"['\"]([^'\"]+)['\"]", down.group(1)))
    found = revs - downs
    return found.pop() if len(found) == 1 else None


def schema_at_head(conn: psycopg.Connection[Any]) -> bool:
    """Whether the target's applier schema is at our head already (no alembic needed).

    Refuses a target older than applier supports first: every command that
    writes the target asks this before anything else."""
    check_target(conn.info.server_version)
    head = script_head()
    if head is None:
        return False
    try:
        row = conn.execute(
            "SELECT pg_catalog.to_regclass('applier.alembic_version') IS NOT NULL"
        ).fetchone()
        if not row or not row[0]:
            return False
        rows = conn.execute("SELECT version_num FROM applier.alembic_version").fetchall()
    except psycopg.Error:
        return False
    return [r[0] for r in rows] == [head]


def upgrade_target(conninfo: str) -> None:
    """Bring the target's ``applier`` schema to head (idempotent)."""
    from alembic import command
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    # A creator keeps the conninfo (and any password in it) out of a URL.
    engine = create_engine(
        "postgresql+psycopg://", creator=lambda: _connect(conninfo), poolclass=NullPool
    )
    cfg = alembic_config()
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            _refuse_unknown_revision(_current_revisions(conn), cfg)
            command.upgrade(cfg, "head")
    finally:
        engine.dispose()
    log.debug("applier schema at head on %s", redact_dsn(conninfo))


def _current_revisions(conn: Any) -> str | None:
    exists = conn.exec_driver_sql(
        "SELECT pg_catalog.to_regclass('applier.alembic_version') IS NOT NULL"
    ).scalar()
    if not exists:
        return None
    sql = "SELECT pg_catalog.string_agg(version_num, ',') FROM applier.alembic_version"
    return conn.exec_driver_sql(sql).scalar()  # type: ignore[no-any-return]


def _refuse_unknown_revision(current: str | None, cfg: AlembicConfig) -> None:
    """A revision this applier does not ship was written by a newer one (applier was
    rolled back): refuse, rather than let alembic fail with a traceback."""
    from alembic.script import ScriptDirectory

    if not current:
        return
    script = ScriptDirectory.from_config(cfg)
    known = {rev.revision for rev in script.walk_revisions()}
    unknown = [r for r in current.split(",") if r not in known]
    if unknown:
        raise PermanentError(
            f"the target's applier schema is at revision {', '.join(unknown)}, newer than "
            f"this applier knows (its newest is {', '.join(script.get_heads())})",
            hint="a newer applier migrated this target: upgrade applier to that version "
            "(or newer) on this machine; the schema is left as it is",
        )


def _connect(conninfo: str) -> Any:
    """A target connection in transactions (SQLAlchemy's and alembic's), pinned as every
    other (:mod:`applier.pgconn`): a database's or role's timeouts, serializable
    default or search_path must not fail (or bound, or hijack) the migrations either."""
    try:
        conn = pgconn.connect(conninfo, side="target", purpose="applier migrate", autocommit=False)
    except psycopg.OperationalError as e:
        raise ConnectionLost(
            f"cannot connect to the target ({redact_dsn(conninfo)}): {str(e).strip()}",
            hint="check that the target server is up and reachable",
        ) from None
    try:
        check_target(conn.info.server_version)
    except ConfigError:
        conn.close()
        raise
    return conn


def current_revision(conninfo: str) -> str | None:
    with _connect(conninfo) as conn:
        exists = conn.execute("SELECT pg_catalog.to_regclass('applier.alembic_version')").fetchone()
        if not exists or exists[0] is None:
            return None
        row = conn.execute("SELECT version_num FROM applier.alembic_version").fetchone()
    return row[0] if row else None


def upgrade(cfg: Config) -> None:
    upgrade_target(cfg.target.conninfo())
