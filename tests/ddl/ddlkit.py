"""What the DDL capture tests share: a source database with a slot, its messages read back."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from applier.config import load_config
from applier.ddl import source
from applier.ddl.message import PREFIX, DdlMessage, decode, signature, signed, split
from applier.localpg import LocalCluster
from applier.protocol import PgOutputDecoder
from applier.protocol.messages import Begin, Commit, Insert, Message

#: What a statement typed in psql or psycopg runs with, unless changed.
DEFAULT_PATH = '"$user", public'


@dataclass
class Source:
    """A fresh source database with a publication of all tables and a pgoutput slot."""

    cluster: LocalCluster
    db: str
    workdir: Path

    @property
    def slot(self) -> str:
        return f"ddl_{self.db}"

    def conn(self, **kw: Any) -> psycopg.Connection[Any]:
        return self.cluster.connect(self.db, **kw)

    def run(self, *statements: str, user: str = "postgres") -> None:
        """Each statement on its own, in autocommit (as psql -c ... -c ... does)."""
        with psycopg.connect(self.cluster.dsn(self.db, user), autocommit=True) as c:
            for s in statements:
                c.execute(s.encode(), prepare=False)

    def quietly(self, *statements: str) -> None:
        """Statements set-up needs, in one transaction the capture leaves out."""
        with self.conn(autocommit=False) as c:
            c.execute("SET LOCAL applier_ddl.capture = off")
            for s in statements:
                c.execute(s.encode(), prepare=False)

    def config(self, user: str = "postgres") -> Path:
        dsn = self.cluster.dsn(self.db, user)
        path = self.workdir / f"applier-{uuid.uuid4().hex[:6]}.toml"
        path.write_text(
            f'[source]\ndsn = "{dsn}"\npublications = ["pub"]\nslot = "{self.slot}"\n'
            f'[target]\ndsn = "{dsn}"\n[tables]\ninclude = ["*.*"]\n'
        )
        return path

    def install(self) -> str:
        return source.install(load_config(self.config()))

    def stream(self) -> list[object]:
        """What the slot has had since the last call: "begin", "insert", "commit"
        and each applier.ddl message decoded (a transactional one: asserted)."""
        rows = self.conn().execute(
            "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
            "'proto_version', '1', 'publication_names', 'pub', 'messages', 'true')",
            (self.slot,),
        )
        decoder = PgOutputDecoder(1)
        out: list[object] = []
        for (data,) in rows.fetchall():
            m = decoder.decode(data)
            if isinstance(m, Message) and m.prefix == PREFIX:
                assert m.transactional, m
                self.assert_signed(m.content)
                out.append(decode(m.content))
            elif isinstance(m, Begin | Insert | Commit):
                out.append(type(m).__name__.lower())
        return out

    def key(self) -> bytes | None:
        """The capture's key (None: not installed), as a superuser reads it."""
        with self.conn() as c:
            if c.execute("SELECT to_regclass('applier_ddl.key')").fetchone() == (None,):
                return None
            row = c.execute("SELECT k FROM applier_ddl.key").fetchone()
            return bytes(row[0]) if row else None

    def assert_signed(self, content: bytes) -> None:
        """The SQL's signing is message.py's: HMAC-SHA256 of the body under the key."""
        parts = split(content)
        assert parts is not None, content
        key = self.key()
        assert key is not None and len(key) == 32
        body, sig = parts
        assert sig == signature(body, key), content
        assert signed(body, key) == content

    def messages(self) -> list[DdlMessage]:
        return [m for m in self.stream() if isinstance(m, DdlMessage)]


@contextmanager
def source_db(cluster: LocalCluster, db: str, workdir: Path) -> Iterator[Source]:
    src = Source(cluster, db, workdir)
    src.run(
        "CREATE PUBLICATION pub FOR ALL TABLES",
        f"SELECT pg_create_logical_replication_slot('{src.slot}', 'pgoutput')",
    )
    yield src


@contextmanager
def role(src: Source, attributes: str = "") -> Iterator[str]:
    """A login role for this test (cluster-wide: dropped at the end)."""
    name = f"r{uuid.uuid4().hex[:8]}"
    src.quietly(
        f"CREATE ROLE {name} LOGIN {attributes}", f"GRANT CREATE ON SCHEMA public TO {name}"
    )
    try:
        yield name
    finally:
        src.quietly(f"DROP OWNED BY {name}")
        src.cluster.execute(f"DROP ROLE {name}")


def cli(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def fatal_lines(stderr: str) -> list[str]:
    """The command's error lines (the log's ERROR lines)."""
    return [ln for ln in stderr.splitlines() if " ERROR " in ln]
