"""Config from the environment: APPLIER_CONFIG, the DSN variables, APPLIER_<SECTION>__<KEY>
overrides (TOML values, environment over file, typos refused) and systemd credentials."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from applier.config import load_config
from applier.configenv import parse_value
from applier.errors import ConfigError

MINIMAL = """
[source]
dsn = "host=127.0.0.1 port=5432 dbname=app user=replicator"
publications = ["app_pub"]
[target]
dsn = "host=127.0.0.1 port=5433 dbname=app user=applier"
[apply]
group_commit = 5
"""


def write(tmp_path: Path, text: str = MINIMAL) -> Path:
    p = tmp_path / "applier.toml"
    p.write_text(text)
    return p


def test_values_are_toml_when_they_parse_else_strings() -> None:
    assert parse_value("42") == 42
    assert parse_value("true") is True
    assert parse_value('"x"') == "x"
    assert parse_value('["a", "b"]') == ["a", "b"]
    assert parse_value('{ k = "v" }') == {"k": "v"}
    assert parse_value("app") == "app"
    assert parse_value("256MB") == "256MB"
    assert parse_value("host=x port=5") == "host=x port=5"
    assert parse_value("1\nother = 2") == "1\nother = 2"  # not one value: a string


def test_every_form_and_environment_over_file(tmp_path: Path) -> None:
    env = {
        "APPLIER_SOURCE_DSN": "host=src port=1 dbname=a",
        "APPLIER_TARGET_DSN": "host=dst port=2 dbname=b",
        "APPLIER_APPLY__GROUP_COMMIT": "42",  # the file says 5
        "APPLIER_APPLY__BINARY": "true",
        "APPLIER_APPLY__MEMORY_LIMIT": "128MB",
        "APPLIER_SOURCE__SLOT": "app",
        "APPLIER_TARGET__ORIGIN": '"app_origin"',
        "APPLIER_SOURCE__PUBLICATIONS": '["p1", "p2"]',
        "APPLIER_CONFLICTS__DEFAULT__INSERT_EXISTS": "skip",
        "APPLIER_BOOTSTRAP__SPARK_CONF": '{ "spark.ui.enabled" = "false" }',
        "APPLIER_LOGGING__FORMAT": "json",
        "APPLIER_CONFIG": "/ignored/here",  # the CLI's, not an override
        "OTHER_VARIABLE": "x",
    }
    cfg = load_config(write(tmp_path), env)
    assert cfg.source.dsn == "host=src port=1 dbname=a"
    assert cfg.target.dsn == "host=dst port=2 dbname=b"
    assert cfg.apply.group_commit == 42
    assert cfg.apply.binary is True
    assert cfg.apply.memory_limit == 128 * 1024**2
    assert cfg.source.slot == "app"
    assert cfg.origin == "app_origin"
    assert cfg.source.publications == ["p1", "p2"]
    assert cfg.conflicts.default["insert_exists"] == "skip"
    assert cfg.bootstrap.spark_conf == {"spark.ui.enabled": "false"}
    assert cfg.logging.format == "json"
    # Without the variables the file's values hold.
    assert load_config(write(tmp_path), {}).apply.group_commit == 5


def test_long_form_of_the_dsn_works_too(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path), {"APPLIER_SOURCE__DSN": "host=s dbname=x"})
    assert cfg.source.dsn == "host=s dbname=x"


@pytest.mark.parametrize(
    ("var", "says"),
    [
        ("APPLIER_APLY__GROUP_COMMIT", "no section [aply]"),
        ("APPLIER_APPLY__GROUP_COMMT", "no key 'group_commt' in [apply]"),
        ("APPLIER_GROUP_COMMIT", "not a key override"),
        ("APPLIER_APPLY_GROUP_COMMIT", "not a key override"),
        ("APPLIER_APPLY__GROUP_COMMIT__X", "apply.group_commit is not a table"),
        ("APPLIER_SOURCE_DSNN", "not a key override"),
    ],
)
def test_a_typo_is_an_error_naming_the_variable(tmp_path: Path, var: str, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)) as e:
        load_config(write(tmp_path), {var: "7"})
    assert str(e.value).startswith(var)


def test_a_bad_value_names_the_variable_not_the_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path), {"APPLIER_APPLY__GROUP_COMMIT": "lots"})
    msg = str(e.value)
    assert msg.startswith("APPLIER_APPLY__GROUP_COMMIT (sets apply.group_commit): ")
    assert "integer" in msg
    with pytest.raises(
        ConfigError, match=r"maybe.*set by APPLIER_CONFLICTS__DEFAULT__INSERT_EXISTS"
    ):
        load_config(write(tmp_path), {"APPLIER_CONFLICTS__DEFAULT__INSERT_EXISTS": "maybe"})
    # A DSN libpq cannot parse: the variable is named, its secret is not shown.
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path), {"APPLIER_TARGET_DSN": "host=x password=hunter2 port"})
    assert str(e.value).startswith("APPLIER_TARGET_DSN (sets target.dsn)")
    assert "hunter2" not in str(e.value)


def test_no_file_when_the_environment_has_every_required_key() -> None:
    env = {
        "APPLIER_SOURCE_DSN": "host=s dbname=a",
        "APPLIER_TARGET_DSN": "host=t dbname=b",
        "APPLIER_SOURCE__PUBLICATIONS": '["pub"]',
    }
    cfg = load_config(None, env)
    assert cfg.source.publications == ["pub"] and cfg.path is None
    del env["APPLIER_SOURCE__PUBLICATIONS"]
    with pytest.raises(ConfigError, match=r"source\.publications.*APPLIER_SOURCE__PUBLICATIONS"):
        load_config(None, env)


def test_password_from_a_systemd_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "target-pw").write_text("hunter2\n")
    text = MINIMAL.replace("[target]\n", '[target]\npassword_credential = "target-pw"\n')
    cfg = load_config(write(tmp_path, text), {})
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    assert "password=hunter2" in cfg.target.conninfo()
    assert "hunter2" not in cfg.target.redacted
    # The same key from the environment.
    env_cfg = load_config(write(tmp_path), {"APPLIER_TARGET__PASSWORD_CREDENTIAL": "target-pw"})
    assert "password=hunter2" in env_cfg.target.conninfo()

    (creds / "target-pw").unlink()
    with pytest.raises(ConfigError, match=r"'target-pw': cannot read .*target-pw") as e:
        cfg.target.conninfo()
    assert "LoadCredential=target-pw:" in (e.value.hint or "")
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ConfigError, match=r"\$CREDENTIALS_DIRECTORY is not set"):
        cfg.target.conninfo()


def test_credential_name_and_one_password_source(tmp_path: Path) -> None:
    bad = MINIMAL.replace("[target]\n", '[target]\npassword_credential = "../etc/shadow"\n')
    with pytest.raises(ConfigError, match=r"target\.password_credential: expected a credential"):
        load_config(write(tmp_path, bad), {})
    both = MINIMAL.replace(
        "[target]\n", '[target]\npassword_credential = "pw"\npassword_file = "/x"\n'
    )
    with pytest.raises(ConfigError, match="set one of them"):
        load_config(write(tmp_path, both), {})


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("APPLIER_")}
    return subprocess.run(
        [sys.executable, "-m", "applier.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **env},
    )


def test_cli_takes_applier_config_and_refuses_typos(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("port=5432", "port=1"))
    # APPLIER_CONFIG stands for --config: the (unreachable) source is tried, exit 1.
    proc = run_cli(["status"], {"APPLIER_CONFIG": str(path)})
    assert proc.returncode == 1, proc.stderr
    proc = run_cli(["status"], {"APPLIER_CONFIG": str(path), "APPLIER_APPLY__GROUP_COMIT": "1"})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and " applier: error: APPLIER_APPLY__GROUP_COMIT" in lines[0]
    proc = run_cli(["status"], {"APPLIER_CONFIG": str(path), "APPLIER_APPLY__GROUP_COMMIT": "x"})
    assert proc.returncode == 2 and "APPLIER_APPLY__GROUP_COMMIT" in proc.stderr


def test_cli_without_any_config_is_a_usage_error_naming_both() -> None:
    proc = run_cli(["status"], {})
    assert proc.returncode == 2
    assert "--config" in proc.stderr and "APPLIER_CONFIG" in proc.stderr
