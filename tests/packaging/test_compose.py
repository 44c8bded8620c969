"""docker-compose.yml is valid for a real compose client and wires what it must.

No Docker engine runs here, so the images are not built: the compose file is
checked by the compose client itself (``config``), the Dockerfile's stages by
reading it, and the demo schema compose loads into the publisher on a real
PostgreSQL 15, against the publication conf/docker.toml streams.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Pair

ROOT = Path(__file__).resolve().parents[2]
CONFIG_IN_CONTAINER = "/etc/applier/applier.toml"


def _compose_config(password: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "POSTGRES_PASSWORD"}
    if password is not None:
        env["POSTGRES_PASSWORD"] = password
    if shutil.which("docker-compose"):
        cmd = ["docker-compose", "-f", "docker-compose.yml", "config"]
    else:  # the plugin form, where a newer docker client has it
        cmd = ["docker", "compose", "-f", "docker-compose.yml", "config", "--format", "json"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    if out.lstrip().startswith("{"):
        return dict(json.loads(out))
    return dict(yaml.safe_load(out))


def _stages() -> dict[str, str]:
    """The Dockerfile's stages: name -> its text (FROM line to the next FROM)."""
    text = (ROOT / "Dockerfile").read_text()
    parts = re.split(r"(?m)^(?=FROM )", text)
    stages: dict[str, str] = {}
    for part in parts[1:]:
        m = re.match(r"FROM \S+ AS (\S+)", part)
        assert m, part.splitlines()[0]
        stages[m.group(1)] = part
    return stages


def test_compose_file_is_valid_and_complete() -> None:
    cfg = _compose_config("only-for-validation")
    services = cfg["services"]
    assert {"publisher", "subscriber", "bootstrap", "applier"} <= set(services)
    for name in ("publisher", "subscriber"):
        svc = services[name]
        assert "wal_level=logical" in " ".join(svc["command"])
        assert "healthcheck" in svc
        assert svc["environment"]["POSTGRES_PASSWORD"] == "only-for-validation"
    assert "only-for-validation" not in (ROOT / "docker-compose.yml").read_text()

    # The publisher loads the demo schema and publication on its first start.
    mounts = " ".join(str(v) for v in services["publisher"]["volumes"])
    assert "conf/docker-init-source.sql:/docker-entrypoint-initdb.d/" in mounts

    # Bootstrap: the full image, once, and a no-op when done already.
    boot = services["bootstrap"]
    assert boot["build"]["target"] == "full"
    assert boot["command"][0] == "bootstrap" and "--if-needed" in boot["command"]
    assert boot["restart"] == "no"
    assert boot["healthcheck"].get("disable") or boot["healthcheck"].get("test") == ["NONE"]

    # The worker: the slim image, only after bootstrap completed successfully.
    app = services["applier"]
    assert app["build"]["target"] == "slim"
    assert app["command"][:1] == ["run"]
    assert app["depends_on"]["bootstrap"]["condition"] == "service_completed_successfully"
    assert app["restart"].startswith("on-failure:")  # bounded: no loop on exit 2 or 3
    for svc in (boot, app):
        assert any(str(v).endswith(f":{CONFIG_IN_CONTAINER}:ro") for v in svc["volumes"])
        assert svc["environment"]["PGPASSWORD"] == "only-for-validation"

    # Both targets exist in the Dockerfile.
    assert {"slim", "full"} <= set(_stages())


def test_compose_works_without_a_password_set() -> None:
    """Out of the box: the demo's default password, the same on every service."""
    services = _compose_config(None)["services"]
    passwords = {
        services["publisher"]["environment"]["POSTGRES_PASSWORD"],
        services["subscriber"]["environment"]["POSTGRES_PASSWORD"],
        services["bootstrap"]["environment"]["PGPASSWORD"],
        services["applier"]["environment"]["PGPASSWORD"],
    }
    assert passwords == {"applier-demo"}


def test_dockerfile_targets() -> None:
    stages = _stages()
    names = list(stages)
    # `docker build .` builds the last stage: the slim one is the default.
    assert names[-1] == "slim"
    slim, full, base = stages["slim"], stages["full"], stages["base"]
    assert slim.startswith("FROM base ") and full.startswith("FROM base ")
    # The slim image: no Java, no Spark, no PostgreSQL programs.
    for word in ("openjdk", "java", "[spark]", "postgresql", "apt-get"):
        assert word not in slim.lower() + base.lower(), word
    assert "openjdk" in full and "[spark]" in full and "postgresql-client" in full
    # Non-root (numeric, so runAsNonRoot can check it) and a health check on status.
    for stage in (slim, full):
        user = re.findall(r"(?m)^USER (\S+)", stage)
        assert user and user[-1].split(":")[0] not in ("0", "root")
    assert re.search(r"(?m)^HEALTHCHECK .*\n?.*applier status", base)


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # compose's versions
def test_demo_schema_matches_docker_toml(pair: Pair) -> None:
    """The init script runs on a real server and publishes what docker.toml streams."""
    pair.pub_exec((ROOT / "conf" / "docker-init-source.sql").read_text())
    conf = tomllib.loads((ROOT / "conf" / "docker.toml").read_text())
    (pub,) = conf["source"]["publications"]
    tables = pair.pub_exec(
        "SELECT schemaname || '.' || tablename FROM pg_publication_tables "
        f"WHERE pubname = '{pub}' ORDER BY 1"
    )
    assert tables == [("public.customers",), ("public.orders",)]
    assert conf["tables"]["include"] == ["public.*"]
    # Every published table has a primary key (UPDATE/DELETE replicate) and rows.
    for (name,) in tables:
        pk = f"SELECT count(*) FROM pg_index WHERE indrelid = '{name}'::regclass AND indisprimary"
        assert pair.pub_exec(pk) == [(1,)]
        assert pair.pub_exec(f"SELECT count(*) > 0 FROM {name}") == [(True,)]
    assert conf["source"]["dsn"].startswith("host=publisher ")
    assert conf["target"]["dsn"].startswith("host=subscriber ")
