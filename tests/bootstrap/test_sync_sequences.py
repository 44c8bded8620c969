"""`applier sync-sequences`: the included tables' sequences get the source's values."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ONE_PAIR, Pair

DDL = """
CREATE SEQUENCE shared_seq START 500;
CREATE TABLE a (id serial PRIMARY KEY, v text);
CREATE TABLE b (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                n int DEFAULT nextval('shared_seq'));
CREATE TABLE skipped (id serial PRIMARY KEY);
"""

SEQS = "SELECT last_value, is_called FROM {}"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", *args], capture_output=True, text=True, timeout=120
    )


def _values(query: object, names: list[str]) -> dict[str, tuple[int, bool]]:
    return {n: tuple(query(SEQS.format(n))[0]) for n in names}  # type: ignore[operator]


@ONE_PAIR
def test_sync_sequences_copies_included_only(pair: Pair) -> None:
    pair.both(DDL)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.pub_exec(
        "INSERT INTO a (v) SELECT 'x' FROM generate_series(1, 42);"
        "INSERT INTO b DEFAULT VALUES; INSERT INTO b DEFAULT VALUES;"
        "INSERT INTO skipped SELECT FROM generate_series(1, 7)"
    )
    cfg = pair.write_config(tables={"exclude": ["public.skipped"]})
    done = _cli("sync-sequences", "--config", str(cfg))
    assert done.returncode == 0, done.stderr
    assert "3 sequence(s) set" in done.stdout
    synced = ["a_id_seq", "b_id_seq", "shared_seq"]
    assert _values(pair.sub_exec, synced) == _values(pair.pub_exec, synced)
    assert _values(pair.sub_exec, synced)["shared_seq"] == (501, True)
    # The excluded table's sequence is left alone.
    assert pair.sub_exec(SEQS.format("skipped_id_seq")) == [(1, False)]
    # The target continues after the source's values.
    assert pair.sub_exec("SELECT nextval('a_id_seq')") == [(43,)]


@ONE_PAIR
def test_sync_sequences_missing_on_target_names_it(pair: Pair) -> None:
    pair.both("CREATE TABLE a (id serial PRIMARY KEY)")
    pair.pub_exec("CREATE SEQUENCE extra_seq; ALTER TABLE a ADD COLUMN n bigint "
                  "DEFAULT nextval('extra_seq')")  # fmt: skip
    pair.sub_exec("ALTER TABLE a ADD COLUMN n bigint")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES; INSERT INTO a DEFAULT VALUES")
    done = _cli("sync-sequences", "--config", str(pair.write_config()))
    assert done.returncode != 0
    assert "public.extra_seq" in done.stderr and "missing on the target" in done.stderr


# A target role on a new target (no applier schema another role made).
@pytest.mark.bare_target
def test_sync_sequences_names_the_sequence_grants(pair: Pair) -> None:
    """Roles that may read the tables but not the sequences (source) nor setval them
    (target): one line with both GRANTs, exit 3, no traceback; granted, it works."""
    from bootstrap.test_privileges import add_role, grants_for

    pair.both("CREATE TABLE a (id serial PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES; INSERT INTO a (v) VALUES ('x'), ('y')")
    src = add_role(pair, "pub", "CREATE ROLE {r} LOGIN; GRANT SELECT ON a TO {r}")
    tgt = add_role(pair, "sub", "CREATE ROLE {r} LOGIN; GRANT SELECT, INSERT ON a TO {r}")
    cfg = pair.write_config(
        source={"dsn": pair.pub.dsn(pair.pub_db, user=src)},
        target={"dsn": pair.sub.dsn(pair.sub_db, user=tgt)},
    )
    done = _cli("sync-sequences", "--config", str(cfg))
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if "GRANT" in ln]
    assert len(lines) == 1, done.stderr
    assert f'GRANT SELECT ON SEQUENCE "public"."a_id_seq" TO "{src}";' in lines[0]
    assert f'GRANT UPDATE ON SEQUENCE "public"."a_id_seq" TO "{tgt}";' in lines[0]
    assert pair.sub_exec(SEQS.format("a_id_seq")) == [(1, False)]
    pair.pub_exec(grants_for(lines[0], "source"))
    pair.sub_exec(grants_for(lines[0], "target"))
    done = _cli("sync-sequences", "--config", str(cfg))
    assert done.returncode == 0, done.stderr
    assert pair.sub_exec(SEQS.format("a_id_seq")) == [(2, True)]
