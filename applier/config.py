"""The TOML configuration: loaded once, validated, typed.

Every error names the file, the key path and what was expected, on one line,
so ``applier run --config F`` fails before touching either database. The
sections mirror the product: ``[source]`` and ``[target]`` connections,
``[tables]`` include/exclude patterns, ``[apply]`` for the worker,
``[bootstrap]`` for the Spark copy, ``[logging]``, ``[status]`` for the health
thresholds of ``applier status``, ``[metrics]`` for the Prometheus endpoint,
``[verify]`` for the load of ``applier verify``.

Every key may also come from an ``APPLIER_*`` environment variable, which
wins over the file (:mod:`applier.configenv`).

DSNs may carry passwords (or take them from ``password_file``, a systemd
credential named by ``password_credential``, PGPASSWORD, ~/.pgpass);
:func:`redact_dsn` is the only way a DSN reaches a log.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    ValidationError,
    field_validator,
    model_validator,
)

from . import configenv
from .errors import ConfigError

_NAME = re.compile(r"^[a-z0-9_]{1,63}$")
_SIZE = re.compile(r"^\s*(\d+)\s*(B|kB|KB|MB|GB|TB)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4}


def parse_size(value: int | str) -> int:
    """``'64MB'`` -> bytes; a bare number is bytes."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    m = _SIZE.match(value)
    if not m:
        raise ValueError("expected a size such as 65536, '64kB', '256MB' or '1GB'")
    return int(m.group(1)) * _UNITS[(m.group(2) or "b").lower()]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Endpoint(_Section):
    dsn: str = Field(description="libpq connection string")
    password_file: Path | None = None
    #: A systemd credential's name (``LoadCredential=NAME:/path`` in the unit): the
    #: password is read from ``$CREDENTIALS_DIRECTORY/NAME``.
    password_credential: str | None = None

    @field_validator("password_credential")
    @classmethod
    def _credential_name(cls, v: str | None) -> str | None:
        if v is not None and (not v or "/" in v or v in (".", "..")):
            raise ValueError("expected a credential name (as in LoadCredential=NAME:...)")
        return v

    @model_validator(mode="after")
    def _one_password_source(self) -> Endpoint:
        if self.password_file is not None and self.password_credential is not None:
            raise ValueError("password_file and password_credential: set one of them")
        return self

    @field_validator("dsn")
    @classmethod
    def _valid_conninfo(cls, v: str) -> str:
        try:
            conninfo_to_dict(v)
        except psycopg.ProgrammingError as e:
            detail = redact_conninfo_error(str(e))
            raise ValueError(f"not a valid libpq connection string ({detail})") from None
        return v

    def conninfo(self, **overrides: Any) -> str:
        """The DSN to connect with: password from ``password_file`` if set."""
        extra: dict[str, Any] = dict(overrides)
        if self.password_file is not None:
            try:
                extra.setdefault("password", self.password_file.read_text().strip())
            except OSError as e:
                raise ConfigError(
                    f"cannot read password_file {self.password_file}: {e.strerror}",
                    hint="check the path and its permissions",
                ) from None
        elif self.password_credential is not None:
            extra.setdefault("password", read_credential(self.password_credential))
        return make_conninfo(self.dsn, **extra)

    @property
    def redacted(self) -> str:
        return redact_dsn(self.dsn)


class SourceConfig(Endpoint):
    publications: list[str] = Field(min_length=1)
    slot: str = "applier"
    #: Create the slot with FAILOVER (PostgreSQL 17+): synchronised to standbys
    #: that have sync_replication_slots on, so it survives a failover.
    failover: bool = False
    #: ``none``: do not apply transactions that carry a replication origin (they
    #: were applied here by some replication): loop prevention for two-way setups,
    #: as PostgreSQL 16's subscription option ``origin``.
    origin: Literal["any", "none"] = "any"

    @field_validator("slot")
    @classmethod
    def _slot_name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("expected a slot name of lower-case letters, digits and _ (max 63)")
        return v


class TargetConfig(Endpoint):
    origin: str | None = None


class TablesConfig(_Section):
    include: list[str] = Field(default_factory=lambda: ["*.*"])
    exclude: list[str] = Field(default_factory=list)

    @field_validator("include", "exclude")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        for p in v:
            _check_table_pattern(p)
        return v

    def includes(self, schema: str, table: str) -> bool:
        """True when ``schema.table`` matches an include pattern and no exclude pattern."""
        return any(table_matches(p, schema, table) for p in self.include) and not any(
            table_matches(p, schema, table) for p in self.exclude
        )


#: The conflict types (PostgreSQL 18's names) and the policies each may take.
CONFLICT_POLICIES: dict[str, tuple[str, ...]] = {
    "insert_exists": ("error", "skip", "keep_local", "apply_remote", "last_update_wins"),
    "update_exists": ("error", "skip", "keep_local"),
    "multiple_unique_conflicts": ("error", "skip", "keep_local"),
    "update_missing": ("error", "skip", "apply_remote"),
    "delete_missing": ("error", "skip"),
    "update_origin_differs": ("apply_remote", "error", "skip", "keep_local", "last_update_wins"),
    "delete_origin_differs": ("apply_remote", "error", "skip", "keep_local", "last_update_wins"),
}
#: What applies where the config names nothing (PostgreSQL 18's subscriber behaves so;
#: the origin_differs types are only checked where the config names them).
DEFAULT_POLICIES: dict[str, str] = {
    "insert_exists": "error",
    "update_exists": "error",
    "multiple_unique_conflicts": "error",
    "update_missing": "skip",
    "delete_missing": "skip",
    "update_origin_differs": "apply_remote",
    "delete_origin_differs": "apply_remote",
}


def table_matches(pattern: str, schema: str, table: str) -> bool:
    """Whether ``schema.table`` matches a ``schema.table`` pattern (shell wildcards).

    The schema and table parts are matched apart, so a wildcard never crosses the
    dot (``my_schema.*`` does not take the schema ``my_schema.x``).
    """
    ps, _, pt = pattern.partition(".")
    return fnmatch.fnmatchcase(schema, ps) and fnmatch.fnmatchcase(table, pt)


def _check_table_pattern(p: str) -> str:
    if p.count(".") != 1 or not all(p.split(".")):
        raise ValueError(f"pattern {p!r}: expected schema.table, '*' allowed (e.g. 'sales.*')")
    return p


class ConflictsConfig(RootModel[dict[str, dict[str, str]]]):
    """``[conflicts]``: ``default`` and table patterns, each a table of type = policy."""

    root: dict[str, dict[str, str]] = Field(default_factory=dict)

    @field_validator("root")
    @classmethod
    def _valid(cls, v: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for key, policies in v.items():
            if key != "default":
                try:
                    _check_table_pattern(key)
                except ValueError as e:
                    raise ValueError(f"{key!r}: {e} (or 'default')") from None
            for kind, policy in policies.items():
                allowed = CONFLICT_POLICIES.get(kind)
                if allowed is None:
                    raise ValueError(
                        f"{key}.{kind}: unknown conflict type; expected one of "
                        + ", ".join(CONFLICT_POLICIES)
                    )
                if policy not in allowed:
                    raise ValueError(
                        f"{key}.{kind} = {policy!r}: expected one of " + ", ".join(allowed)
                    )
        return v

    @property
    def default(self) -> dict[str, str]:
        return {**DEFAULT_POLICIES, **self.root.get("default", {})}

    @property
    def patterns(self) -> dict[str, dict[str, str]]:
        return {k: p for k, p in self.root.items() if k != "default"}

    @property
    def needs_commit_ts(self) -> bool:
        """Whether a policy reads the target rows' commit timestamps: last_update_wins,
        or a named ``*_origin_differs`` (checked only where named)."""
        return any(
            policy == "last_update_wins" or kind.endswith("_origin_differs")
            for entry in self.root.values()
            for kind, policy in entry.items()
        )


class ApplyConfig(_Section):
    streaming: Literal["on", "off", "parallel"] = "parallel"
    two_phase: bool = False
    binary: bool = False
    memory_limit: int = Field(
        default=64 * 1024**2, description="bytes of a streamed txn kept in memory"
    )
    #: None: a private state directory (see applier.apply.spool.default_spool_dir).
    spool_dir: Path | None = None
    spool_limit: int = Field(
        default=0, description="bytes on disk a streamed txn's spool may take; 0 = no limit"
    )
    synchronous_commit: Literal["on", "off", "local", "remote_write", "remote_apply"] = "off"
    status_interval: float = Field(default=10.0, gt=0)
    timeout: float = Field(
        default=60.0, gt=0, description="seconds of server silence before reconnecting"
    )
    # See applier/apply/targetconn.py, "A stalled connection".
    target_timeout: float = Field(
        default=60.0,
        ge=1,
        description="seconds a target socket may stay silent while results are owed "
        "before the server is asked whether our backend still executes",
    )
    # 1000: see "Group commit" in applier/apply/handlers.py and bench/README-apply.md.
    group_commit: int = Field(
        default=1000, ge=1, description="at most this many source txns per target txn; 1 = off"
    )
    # See applier/apply/merge.py.
    merge_updates: bool = Field(
        default=True,
        description="send only the final state of rows updated several times in a target txn",
    )
    # See applier/apply/copyrun.py: a run this long pays for leaving the pipeline
    # (bench/README-apply.md: 1000-row transactions, 4096 against 1000: 3.4 s vs 4.2 s).
    copy_threshold: int = Field(
        default=4096, ge=0, description="runs of this many INSERTs into one table use COPY; 0 = off"
    )

    @field_validator("memory_limit", "spool_limit", mode="before")
    @classmethod
    def _size(cls, v: int | str) -> int:
        return parse_size(v)


class BootstrapConfig(_Section):
    spark_master: str = "local[*]"
    spark_conf: dict[str, str] = Field(default_factory=dict)
    slice_size: int = Field(default=256 * 1024**2)
    #: Copy tasks running at once, at most; None: as many as Spark runs
    #: (its task slots: the N of local[N], the executors' cores).
    parallelism: int | None = Field(default=None, ge=1)
    #: For the post-data index builds, unless the target's own setting is higher.
    maintenance_work_mem: int = Field(default=2 * 1024**3)
    #: The driver JVM's class archive (see applier.bootstrap.spark): "auto"
    #: (a per-user cache file, used when `applier spark-archive` wrote it),
    #: "off", or a file path.
    class_archive: str = Field(default="auto", min_length=1)

    @field_validator("slice_size", "maintenance_work_mem", mode="before")
    @classmethod
    def _size(cls, v: int | str) -> int:
        return parse_size(v)


class LoggingConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"
    #: Prefix each line with its syslog priority (<3> <4> <6> <7>) for journald (sd-daemon(3)).
    journald: bool = False


class StatusConfig(_Section):
    """``[status]``: when ``applier status`` calls the slot unhealthy (exit 5)."""

    # 16GB = 1024 WAL segments. PostgreSQL keeps a slot's WAL without bound by
    # default (max_slot_wal_keep_size = -1), so this is the alarm before the
    # source's disk fills. A caught-up worker retains little (its slot's
    # restart_lsn only lags by the oldest transaction still open on the source),
    # so 16GB does not trip on a healthy worker of a modest server or a long
    # source transaction, and still fires hours before a typical pg_wal volume
    # (100GB+) fills at a few MB/s. Set it to a fraction of the free space there.
    max_retained_wal: int = Field(
        default=16 * 1024**3,
        ge=0,
        description="WAL bytes the slot may retain before status exits 5; 0 = no check",
    )

    @field_validator("max_retained_wal", mode="before")
    @classmethod
    def _size(cls, v: int | str) -> int:
        return parse_size(v)


_LISTEN = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]*)):(?P<port>\d{1,5})$"
)


def parse_listen(value: str) -> tuple[str, int]:
    """``"127.0.0.1:9187"``, ``"[::1]:9187"``, ``":9187"`` (all interfaces) -> (host, port)."""
    m = _LISTEN.match(value.strip())
    port = int(m.group("port")) if m else 0
    if not m or not 1 <= port <= 65535:
        raise ValueError(
            f"{value!r}: expected HOST:PORT with a port from 1 to 65535, e.g. "
            "'127.0.0.1:9187', '[::1]:9187' or ':9187' for every interface"
        )
    return (m.group("v6") or m.group("host") or "0.0.0.0"), port


class MetricsConfig(_Section):
    """``[metrics]``: the Prometheus endpoint of ``applier run`` (applier.metrics)."""

    #: None: no endpoint.
    listen: str | None = None

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str | None) -> str | None:
        if v is not None:
            parse_listen(v)
        return v

    @property
    def address(self) -> tuple[str, int] | None:
        return None if self.listen is None else parse_listen(self.listen)


class VerifyConfig(_Section):
    """``[verify]``: the load ``applier verify`` may put on both servers (applier.verify)."""

    #: Spark tasks hashing ranges at once (each holds one connection per server);
    #: None: as many as Spark runs at once (its task slots).
    parallelism: int | None = Field(default=None, ge=1)
    #: Rows per key range of the first pass (the --chunk-rows default).
    chunk_rows: int = Field(default=100_000, ge=100)
    #: A differing range is cut until it holds at most this many rows, then its
    #: (key, row hash) pairs are read from both sides and compared.
    fetch_rows: int = Field(default=500, ge=10)
    #: statement_timeout (and lock_timeout) of every verify query, seconds; 0 = none.
    statement_timeout: float = Field(default=600.0, ge=0)
    #: Seconds a range waits for the target to apply up to its source snapshot.
    catchup_timeout: float = Field(default=60.0, ge=0)


class Config(_Section):
    source: SourceConfig
    target: TargetConfig
    tables: TablesConfig = Field(default_factory=TablesConfig)
    apply: ApplyConfig = Field(default_factory=ApplyConfig)
    conflicts: ConflictsConfig = Field(default_factory=ConflictsConfig)
    bootstrap: BootstrapConfig = Field(default_factory=BootstrapConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    status: StatusConfig = Field(default_factory=StatusConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    path: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _default_origin(self) -> Config:
        if self.target.origin is None:
            object.__setattr__(
                self, "target", self.target.model_copy(update={"origin": self.source.slot})
            )
        elif not _NAME.match(self.target.origin):
            raise ValueError("target.origin: expected lower-case letters, digits and _ (max 63)")
        return self

    @property
    def origin(self) -> str:
        assert self.target.origin is not None
        return self.target.origin


def load_config(path: str | Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate a config file, then the ``APPLIER_*`` overrides of ``environ``
    (default: the process's; see :mod:`applier.configenv`), which win over the file.

    ``path`` None: the config comes from the environment alone. Errors are
    :class:`ConfigError` naming the key, and the variable when one set it.
    """
    found = configenv.overrides(os.environ if environ is None else environ, Config)
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(
                f"{path}: no such file", hint="pass --config PATH to an existing file"
            ) from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return config_from_dict(configenv.apply_overrides(raw, found), path, found)


def config_from_dict(
    raw: dict[str, Any], path: Path | None = None, env: list[configenv.Override] | None = None
) -> Config:
    where = str(path) if path else "config"
    try:
        cfg = Config.model_validate({**raw, "path": path})
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(str(p) for p in err["loc"])
        key = ".".join(loc) or "(top level)"
        msg = _explain(err)
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        var = configenv.var_for(loc, env or [])
        if var is not None:
            raise ConfigError(f"{var} (sets {key}): {msg}{more}") from None
        if err["type"] == "missing" and path is None and env:
            alt = f"it as {configenv.env_name(loc)}" if len(loc) > 1 else "its keys as APPLIER_*"
            msg += f" (pass --config PATH or set APPLIER_CONFIG, or give {alt})"
        inside = configenv.vars_within(loc, env or []) if loc else []
        if inside:
            more += f" (keys in it set by {', '.join(inside)})"
        raise ConfigError(f"{where}: {key}: {msg}{more}") from None
    return cfg


def read_credential(name: str) -> str:
    """A systemd credential's content (``LoadCredential=``), stripped of its newline."""
    where = os.environ.get("CREDENTIALS_DIRECTORY")
    hint = (
        f"start applier from a systemd unit with LoadCredential={name}:/path/to/secret "
        "(or use password_file)"
    )
    if not where:
        raise ConfigError(
            f"password_credential {name!r}: $CREDENTIALS_DIRECTORY is not set", hint=hint
        )
    try:
        return (Path(where) / name).read_text().strip()
    except OSError as e:
        raise ConfigError(
            f"password_credential {name!r}: cannot read {Path(where) / name}: {e.strerror}",
            hint=hint,
        ) from None


def _explain(err: Any) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        return "unknown key (check its spelling and section)"
    msg = " ".join(str(err["msg"]).split())  # one line, whatever the validator said
    return msg.removeprefix("Value error, ")


#: libpq keywords whose values are secrets: libpq's own "password-like"
#: ones (dispchar ``*``) plus the SCRAM keys, whatever libpq version is loaded.
_SECRET_KEYS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)


@functools.cache
def secret_keys() -> frozenset[str]:
    """Every libpq keyword whose value must never be shown."""
    from psycopg import pq

    try:
        starred = {o.keyword.decode() for o in pq.Conninfo.get_defaults() if o.dispchar == b"*"}
    except psycopg.Error:  # pragma: no cover - libpq without conninfo defaults
        starred = set()
    return _SECRET_KEYS | starred


def redact_dsn(dsn: str) -> str:
    """A DSN fit for logs: every secret (password, sslpassword, ...) replaced by ``***``."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    hidden = secret_keys()
    return " ".join(f"{k}={'***' if k in hidden else v}" for k, v in params.items())


_QUOTED = re.compile(r'"[^"]*"')


def redact_conninfo_error(message: str) -> str:
    """libpq's complaint about a DSN, one line, without the text it quotes.

    libpq quotes the piece it choked on (``missing "=" after "..."``,
    ``invalid percent-encoded token: "..."``), which can be part of a password.
    """
    return _QUOTED.sub('"***"', " ".join(message.split())).replace('missing "***"', 'missing "="')
