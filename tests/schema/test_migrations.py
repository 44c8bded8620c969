"""The applier schema: an empty database upgrades to head, once and again, with one head."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import Pair

from applier.schema import current_revision, heads, schema_at_head, script_head, upgrade_target

ROOT = Path(__file__).resolve().parents[2]

# The migrations themselves, from an empty target (tests/conftest.py clones the
# other tests' targets from a migrated one).
pytestmark = pytest.mark.bare_target


def test_single_head() -> None:
    assert len(heads()) == 1


def test_empty_target_upgrades_to_head_idempotently(pair: Pair) -> None:
    assert current_revision(pair.sub_dsn) is None
    upgrade_target(pair.sub_dsn)
    assert current_revision(pair.sub_dsn) == heads()[0]
    upgrade_target(pair.sub_dsn)  # a second run is a no-op, not an error
    tables = {r[0] for r in pair.sub_exec(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'applier'"
    )}  # fmt: skip
    assert {"alembic_version", "worker_status"} <= tables
    # Fenced: nothing of ours outside the applier schema.
    assert pair.sub_exec("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]


def test_migrate_command_upgrades(pair: Pair) -> None:
    cfg = pair.write_config()
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "migrate", "--config", str(cfg)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert current_revision(pair.sub_dsn) == heads()[0]


@pytest.mark.slow
def test_wheel_ships_the_migrations(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("pg_applier-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "applier/_migrations/env.py" in names
    assert any(n.startswith("applier/_migrations/versions/0001") for n in names)


def test_script_head_agrees_with_alembic_and_target_check(pair: Pair) -> None:
    assert script_head() == heads()[0]
    with pair.sub_conn() as conn:
        assert not schema_at_head(conn)
        upgrade_target(pair.sub_dsn)
        assert schema_at_head(conn)


def test_upgrade_ignores_the_target_databases_timeouts(pair: Pair) -> None:
    """A role's or database's defaults must not make the migrations fail or wait forever."""
    pair.sub_exec(
        f"ALTER DATABASE {pair.sub_db} SET statement_timeout = '1ms';"
        f"ALTER DATABASE {pair.sub_db} SET default_transaction_isolation = 'serializable'"
    )
    upgrade_target(pair.sub_dsn)
    assert current_revision(pair.sub_dsn) == heads()[0]


@pytest.mark.parametrize("command", ["migrate", "run"])
def test_schema_newer_than_this_applier_is_a_clear_error(pair: Pair, command: str) -> None:
    """Rolling applier back after a newer one migrated the target: a clear error naming
    both revisions and what to do, exit 3, and the schema left as it was."""
    upgrade_target(pair.sub_dsn)
    pair.sub_exec("UPDATE applier.alembic_version SET version_num = '9999'")
    cfg = pair.write_config()
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", command, "--config", str(cfg)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "9999" in proc.stderr and heads()[0] in proc.stderr
    assert "newer" in proc.stderr and "upgrade applier" in proc.stderr
    assert current_revision(pair.sub_dsn) == "9999"


def test_0012_ddl_skips_down_and_up_again(pair: Pair) -> None:
    """0012 finds 0006's generated CHECK names by definition, on every version; its
    downgrade puts them back, so 0012 runs again."""
    from alembic import command
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from applier.schema import alembic_config

    upgrade_target(pair.sub_dsn)
    pair.sub_exec(
        "INSERT INTO applier.skip_rules (origin, kind, lsn, dump) "
        "VALUES ('o', 'ddl', '0/10', 'skipped');"
        "INSERT INTO applier.skipped_changes (origin, change_no, op, skipped, statement) "
        "VALUES ('o', 0, 'ddl', true, 'ALTER TABLE t ADD c int')"
    )
    with pytest.raises(Exception, match="skipped_changes_ddl_check"):
        pair.sub_exec(
            "INSERT INTO applier.skipped_changes (origin, change_no, op, skipped) "
            "VALUES ('o', 0, 'insert', true)"
        )
    with pytest.raises(Exception, match="skip_rules_ddl_check"):
        pair.sub_exec(
            "INSERT INTO applier.skip_rules (origin, kind, lsn, xid, dump) "
            "VALUES ('o', 'ddl', '0/10', 5, 'skipped')"
        )
    engine = create_engine(
        "postgresql+psycopg://", creator=lambda: pair.sub_conn(), poolclass=NullPool
    )
    cfg = alembic_config()
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0011")
    finally:
        engine.dispose()
    assert current_revision(pair.sub_dsn) == "0011"
    assert pair.sub_exec("SELECT count(*) FROM applier.skip_rules WHERE kind = 'ddl'") == [(0,)]
    upgrade_target(pair.sub_dsn)
    assert current_revision(pair.sub_dsn) == heads()[0]
