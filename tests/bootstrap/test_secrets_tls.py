"""Secrets and TLS: a source that only takes TLS + SCRAM, reached with
``sslmode=verify-full`` and ``channel_binding=require`` by every bootstrap
child (pg_dump, psql, the Spark tasks) and by ``applier run``; no password
on any command line or in a log; DSN errors and redaction hide every secret."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from apply.applykit import ROOT, Runner, wait_equal
from conftest import Pair

from applier.bootstrap import schema as ddl
from applier.bootstrap.copy_task import SliceTask, copy_slice
from applier.config import load_config
from applier.errors import BootstrapError, ConfigError
from applier.redact import redact_dsn
from applier.schema import upgrade_target

PASSWORD = "tls-S3cret-pw-4b1d"
PLAIN_PASSWORD = "plain-S3cret-pw-77c0"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d: Path) -> dict[str, Path]:
    """A self-signed CA and a server certificate for localhost / 127.0.0.1."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=applier test CA", cwd=d)  # fmt: skip
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost",
             cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.ext",
             cwd=d)  # fmt: skip
    return {"ca": d / "ca.crt", "server.crt": d / "server.crt", "server.key": d / "server.key"}


@pytest.fixture
def tls_pair(make_pair: Callable[..., Pair], tmp_path: Path) -> tuple[Pair, Path]:
    """A PG15 source that takes role ``app`` only over TLS with SCRAM (role
    ``plain`` over TLS with a cleartext password), and a plain PG15 target."""
    certs = make_certs(tmp_path)
    pair = make_pair(
        15,
        15,
        pub_settings={
            "ssl": "on",
            "ssl_cert_file": "'server.crt'",
            "ssl_key_file": "'server.key'",
            "password_encryption": "'scram-sha-256'",
        },
        pub_hba=[
            "hostssl all app 127.0.0.1/32 scram-sha-256",
            "hostssl replication app 127.0.0.1/32 scram-sha-256",
            "hostssl all plain 127.0.0.1/32 password",
            "host all app,plain 127.0.0.1/32 reject",
            "host replication app,plain 127.0.0.1/32 reject",
        ],
        pub_files={"server.crt": certs["server.crt"], "server.key": certs["server.key"]},
    )
    pair.pub_exec(
        f"CREATE ROLE app LOGIN SUPERUSER PASSWORD '{PASSWORD}';"
        f"CREATE ROLE plain LOGIN SUPERUSER PASSWORD '{PLAIN_PASSWORD}';"
    )
    return pair, certs["ca"]


def _tls_dsn(pair: Pair, ca: Path, user: str = "app") -> str:
    return (
        f"host=localhost hostaddr=127.0.0.1 port={pair.pub.port} dbname={pair.pub_db} "
        f"user={user} sslmode=verify-full sslrootcert={ca} channel_binding=require"
    )


class CmdlineWatch(threading.Thread):
    """Records every command line of this process's descendants (psql, pg_dump,
    spark-submit, the JVM, Python workers) that contains ``needle``."""

    def __init__(self, needle: str) -> None:
        super().__init__(daemon=True)
        self.needle, self.seen = needle, 0
        self.found: list[str] = []
        self.stop_ev = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop_ev.is_set():
            for p in me.children(recursive=True):
                try:
                    cmd = " ".join(p.cmdline())
                except psutil.Error:
                    continue
                self.seen += 1
                if self.needle in cmd:
                    self.found.append(cmd)
            self.stop_ev.wait(0.02)


@pytest.mark.spark
def test_bootstrap_and_run_over_tls_with_channel_binding(tls_pair: tuple[Pair, Path]) -> None:
    pair, ca = tls_pair
    pair.pub_exec(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 2000) g;"
        "CREATE PUBLICATION pub FOR TABLE t;"
    )
    pw_file = pair.workdir / "source.pw"
    pw_file.write_text(PASSWORD + "\n")
    cfg_path = pair.write_config(
        source={"dsn": _tls_dsn(pair, ca), "password_file": str(pw_file)},
        bootstrap={"spark_master": "local[1]", "slice_size": "32kB"},
    )
    watch = CmdlineWatch(PASSWORD)
    watch.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "applier.cli", "bootstrap", "--config", str(cfg_path),
             "--quiet"],
            capture_output=True, text=True, timeout=240, cwd=ROOT,
        )  # fmt: skip
    finally:
        watch.stop_ev.set()
        watch.join()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert PASSWORD not in proc.stdout + proc.stderr
    assert watch.found == [] and watch.seen > 0
    # Every copy went through the TLS-only source: several slices, all rows.
    assert pair.sub_exec("SELECT count(*) > 1 FROM applier.bootstrap_slice") == [(True,)]
    assert pair.sub_exec("SELECT count(*) FROM t") == [(2000,)]

    # The stream and the apply over the same DSN.
    runner = Runner(pair, cfg_path).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (5001, 'after'); UPDATE t SET v = 'u' WHERE id = 1;")
    wait_equal(pair, ["t"], runner=runner)
    ssl = pair.pub_exec(
        "SELECT a.backend_type, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
        "WHERE a.usename = 'app'"
    )
    assert ("walsender", True) in ssl and all(on for _, on in ssl)
    assert runner.stop() == 0
    assert PASSWORD not in runner.log()


def test_children_honour_channel_binding(tls_pair: tuple[Pair, Path]) -> None:
    """``plain`` authenticates with a cleartext password: channel_binding=require must
    make pg_dump and the copy's psql refuse to connect, as libpq does (before, the
    keyword was turned into PGCHANNEL_BINDING, which libpq does not know)."""
    pair, ca = tls_pair
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("INSERT INTO t VALUES (1, 'a')")
    upgrade_target(pair.sub_dsn)
    dsn = f"{_tls_dsn(pair, ca, 'plain')} password={PLAIN_PASSWORD}"
    with pytest.raises(BootstrapError, match="channel binding"):
        ddl.dump(dsn, [("public", "t")], "pre-data", None)
    with pair.pub_conn() as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        snap = str(conn.execute("SELECT pg_export_snapshot()").fetchone()[0])  # type: ignore[index]
        task = SliceTask(
            source_conninfo=dsn, target_conninfo=pair.sub_dsn, snapshot=snap, slot="s",
            run_id=1, src_schema="public", src_name="t", dst_schema="public", dst_name="t",
            columns=("id", "v"), binary=True, slice_no=0, where=None,
        )  # fmt: skip
        with pytest.raises(BootstrapError, match="channel binding"):
            copy_slice(task)
        assert PLAIN_PASSWORD not in repr(task)
    assert pair.sub_exec("SELECT count(*) FROM t") == [(0,)]


# -- redaction -------------------------------------------------------------------------


def test_redact_dsn_masks_every_secret() -> None:
    out = redact_dsn("host=x user=u password=pw1 sslpassword=pw2 sslkey=/k")
    assert "pw1" not in out and "pw2" not in out
    assert sorted(out.split()) == sorted(
        ["host=x", "user=u", "password=***", "sslpassword=***", "sslkey=/k"]
    )
    assert "pw3" not in redact_dsn("postgresql://u:pw3@x/db?sslpassword=pw3")


@pytest.mark.parametrize(
    "dsn",
    [
        "host=x password=my secret-part",  # missing "=" after "secret-part"
        "host=x password=a secret-part=1",  # invalid connection option "secret-part"
        "postgresql://u:pw%zzsecret-part@x/db",  # invalid percent-encoded token
    ],
)
def test_dsn_errors_do_not_echo_secrets(tmp_path: Path, dsn: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[source]\ndsn = "{dsn}"\npublications = ["p"]\n[target]\ndsn = "host=y"\n')
    with pytest.raises(ConfigError, match="not a valid libpq connection string") as ei:
        load_config(cfg)
    assert "secret-part" not in str(ei.value)
