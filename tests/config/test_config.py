"""Config loading: the public keys work as written; every error names file and key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from applier.config import load_config
from applier.errors import ConfigError
from applier.redact import redact_dsn

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "conf" / "applier.example.toml"

MINIMAL = """
[source]
dsn = "host=127.0.0.1 port=5432 dbname=app user=replicator"
publications = ["app_pub"]
slot = "applier"
[target]
dsn = "host=127.0.0.1 port=5433 dbname=app user=applier"
[tables]
include = ["public.*", "*.t3", "sales.*"]
exclude = ["public.tmp_*"]
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "applier.toml"
    p.write_text(text)
    return p


def test_example_config_loads() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.source.publications == ["app_pub"]
    assert cfg.origin == "applier"
    assert cfg.apply.memory_limit == 64 * 1024**2
    assert cfg.bootstrap.spark_master == "local[*]"


def test_contract_keys_and_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.origin == "applier"  # defaults to the slot name
    assert cfg.tables.includes("public", "orders")
    assert cfg.tables.includes("other", "t3")
    assert cfg.tables.includes("sales", "x")
    assert not cfg.tables.includes("public", "tmp_1")
    assert not cfg.tables.includes("other", "t33")


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (
            lambda t: t.replace('publications = ["app_pub"]', "publications = []"),
            "source.publications",
        ),
        (lambda t: t.replace('slot = "applier"', 'slot = "Bad-Slot"'), "source.slot"),
        (
            lambda t: t.replace('dsn = "host=127.0.0.1 port=5433', 'dsn = "host=127.0.0.1 port'),
            "target.dsn",
        ),
        (lambda t: t.replace('"*.t3"', '"t3"'), "tables.include"),
        (lambda t: t + "\n[apply]\nstreaming = 'sometimes'\n", "apply.streaming"),
        (lambda t: t + "\n[apply]\nmemory_limit = 'lots'\n", "apply.memory_limit"),
        (lambda t: t + "\n[apply]\nstreamin = 'on'\n", "apply.streamin"),
        (lambda t: t + "\n[apply]\nworkers = 0\n", "apply.workers"),
        (lambda t: t + "\n[apply]\nworkers = 65\n", "apply.workers"),
        (lambda t: t.replace("[target]", "[targt]"), "targt: unknown key"),
    ],
)
def test_errors_name_file_and_key(tmp_path: Path, edit: object, key: str) -> None:
    path = write(tmp_path, edit(MINIMAL))  # type: ignore[operator]
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert str(path) in text and key in text
    assert "\n" not in text
    assert err.value.exit_code == 2


def test_workers_bounds_and_trusted_triggers(tmp_path: Path) -> None:
    """1 to 64 sessions; trusted_triggers a list of table patterns; beyond: exit 2, one line."""
    extra = '\n[apply]\nworkers = 4\ntrusted_triggers = ["public.*"]\n'
    cfg = load_config(write(tmp_path, MINIMAL + extra))
    assert cfg.apply.workers == 4 and cfg.apply.trusted_triggers == ["public.*"]
    path = write(tmp_path, MINIMAL + "\n[apply]\nworkers = 65\n")
    proc = run_cli("run", "--config", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "apply.workers" in lines[0]


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[source\n"))
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.toml")


def test_password_file_and_redaction(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("hunter2\n")
    text = MINIMAL.replace("[target]\n", f'[target]\npassword_file = "{secret}"\n')
    cfg = load_config(write(tmp_path, text))
    assert "password=hunter2" in cfg.target.conninfo()
    assert "hunter2" not in cfg.target.redacted
    redacted = redact_dsn("host=x password=hunter2 user=u")
    assert sorted(redacted.split()) == ["host=x", "password=***", "user=u"]
    assert "hunter2" not in redact_dsn("postgresql://u:hunter2@x:5432/db")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_help_and_usage_errors() -> None:
    assert run_cli("--help").returncode == 0
    help_run = run_cli("run", "--config", str(EXAMPLE), "--help")
    assert help_run.returncode == 0 and "--config" in help_run.stdout
    cmds = ("run", "bootstrap", "decode", "status", "sync-sequences", "migrate", "demo")
    for cmd in (*cmds, "spark-archive"):
        assert run_cli(cmd, "--help").returncode == 0, cmd
    assert run_cli("frobnicate").returncode == 2
    assert run_cli("run", "--no-such-option").returncode == 2
    assert run_cli("run").returncode == 2  # --config is required


def test_cli_broken_config_is_one_line_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace('slot = "applier"', "slot = 5"))
    proc = run_cli("status", "--config", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "source.slot" in lines[0] and str(path) in lines[0]
