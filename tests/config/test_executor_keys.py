"""``[bootstrap]`` keys of a Spark cluster: the executors' Python and DSNs, and no
password in SparkConf (README, "Running on a Spark cluster")."""

from __future__ import annotations

from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from applier.bootstrap.executors import is_local, task_dsn
from applier.config import Config, load_config
from applier.errors import ConfigError
from applier.pgconn import SHIPPED

BASE = """
[source]
dsn = "host=db1 dbname=app user=rep password=src-S3cret"
publications = ["p"]
[target]
dsn = "host=db2 dbname=app user=app"
[bootstrap]
"""


def _load(tmp_path: Path, bootstrap: str) -> Config:
    path = tmp_path / "c.toml"
    path.write_text(BASE + bootstrap)
    return load_config(path)


def test_executor_keys_load(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        'spark_master = "spark://m:7077"\nexecutor_python = "/opt/env/bin/python"\n'
        'executor_source_dsn = "host=db1.internal dbname=app user=rep"\n',
    )
    assert cfg.bootstrap.executor_python == "/opt/env/bin/python"
    assert cfg.bootstrap.executor_target_dsn is None


@pytest.mark.parametrize(
    "key", ["spark.executorEnv.PGPASSWORD", "spark.yarn.appMasterEnv.PGPASSWORD"]
)
def test_a_password_in_spark_conf_is_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(ConfigError, match="a password in SparkConf") as ei:
        _load(tmp_path, f'spark_conf = {{ "{key}" = "pw-in-conf" }}\n')
    assert "pw-in-conf" not in str(ei.value) and "bootstrap.spark_conf" in str(ei.value)


def test_a_bad_executor_dsn_is_refused_without_its_secret(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="executor_target_dsn: not a valid libpq") as ei:
        _load(tmp_path, 'executor_target_dsn = "host=x password=my secret-part"\n')
    assert "secret-part" not in str(ei.value)


class _Files:
    """What task_dsn asks of a SparkContext: addFile."""

    def __init__(self) -> None:
        self.added: list[str] = []

    def addFile(self, path: str) -> None:
        self.added.append(path)


def test_task_dsns_keep_the_password_off_the_task_on_a_cluster(tmp_path: Path) -> None:
    """Local master: the driver's DSN as it is. Cluster: the password goes to a
    0600 pgpass file shipped with the job, the task's DSN names it; an executor DSN
    with a passfile of its own is used as written."""
    local = _load(tmp_path, 'spark_master = "local[2]"\n')
    assert "src-S3cret" in task_dsn(local, "source", _Files())
    assert is_local("local") and is_local("local[*]") and not is_local("spark://m:7077")

    cfg = _load(tmp_path, 'spark_master = "spark://m:7077"\n')
    sc = _Files()
    dsn = task_dsn(cfg, "source", sc)
    params = conninfo_to_dict(dsn)
    assert "src-S3cret" not in dsn and "password" not in params
    assert str(params["passfile"]).startswith(SHIPPED)
    (shipped,) = sc.added
    assert Path(shipped).name == str(params["passfile"])[len(SHIPPED) :]
    assert Path(shipped).read_text() == "*:*:*:*:src-S3cret\n"
    assert Path(shipped).stat().st_mode & 0o777 == 0o600
    assert Path(shipped).parent.stat().st_mode & 0o777 == 0o700
    assert task_dsn(cfg, "source", sc) == dsn and len(sc.added) == 1  # shipped once
    assert task_dsn(cfg, "target", sc) == cfg.target.dsn

    own = _load(
        tmp_path,
        'spark_master = "yarn"\nexecutor_source_dsn = "host=db1.internal user=rep '
        'passfile=/etc/applier/pgpass"\n',
    )
    assert task_dsn(own, "source", _Files()) == own.bootstrap.executor_source_dsn
