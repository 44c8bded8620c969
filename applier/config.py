"""The TOML configuration: loaded once, validated, typed.

Every error names the file, the key path and what was expected, on one line,
so ``applier run --config F`` fails before touching either database. The
sections mirror the product: ``[source]`` and ``[target]`` connections,
``[tables]`` include/exclude patterns, ``[apply]`` for the worker,
``[bootstrap]`` for the Spark copy, ``[logging]``, ``[status]`` for the health
thresholds of ``applier status``, ``[metrics]`` for the Prometheus endpoint,
``[verify]`` for the load of ``applier verify``, ``[schema]`` for schema changes
the stream shows.

Every key may also come from an ``APPLIER_*`` environment variable, which
wins over the file (:mod:`applier.configenv`).

DSNs may carry passwords (or take them from ``password_file``, a systemd
credential named by ``password_credential``, PGPASSWORD, ~/.pgpass);
:func:`~applier.redact.redact_dsn` is the only way a DSN reaches a log.
"""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec
import psycopg
from msgspec import Meta
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import configenv
from .apply.rules.conflicttype import ConflictType
from .configenv import read_credential
from .errors import ConfigError
from .redact import redact_conninfo_error, redact_dsn

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


#: Bytes; the file may also say '64kB', '256MB', '1GB' (see _SIZE_KEYS).
Size = Annotated[int, Meta(ge=0)]


class _Invalid(ValueError):
    """A key's value is wrong. Raised in ``__post_init__``, which msgspec places at
    the struct: the key rides along so the message names it (:func:`_where`)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}{_KEY_SEP}{message}")


_KEY_SEP = "\x1f"


class _Section(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    pass


class Endpoint(_Section, frozen=True):
    #: A libpq connection string.
    dsn: str
    password_file: Path | None = None
    #: A systemd credential's name (``LoadCredential=NAME:/path`` in the unit): the
    #: password is read from ``$CREDENTIALS_DIRECTORY/NAME``.
    password_credential: str | None = None

    def __post_init__(self) -> None:
        try:
            conninfo_to_dict(self.dsn)
        except psycopg.ProgrammingError as e:
            detail = redact_conninfo_error(str(e))
            raise _Invalid("dsn", f"not a valid libpq connection string ({detail})") from None
        v = self.password_credential
        if v is not None and (not v or "/" in v or v in (".", "..")):
            raise _Invalid(
                "password_credential", "expected a credential name (as in LoadCredential=NAME:...)"
            )
        if self.password_file is not None and v is not None:
            raise ValueError("password_file and password_credential: set one of them")

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


class SourceConfig(Endpoint, kw_only=True, frozen=True):
    publications: Annotated[list[str], Meta(min_length=1)]
    slot: str = "applier"
    #: Create the slot with FAILOVER (PostgreSQL 17+): synchronised to standbys
    #: that have sync_replication_slots on, so it survives a failover.
    failover: bool = False
    #: ``none``: do not apply transactions that carry a replication origin (they
    #: were applied here by some replication): loop prevention for two-way setups,
    #: as PostgreSQL 16's subscription option ``origin``.
    origin: Literal["any", "none"] = "any"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not _NAME.match(self.slot):
            raise _Invalid(
                "slot", "expected a slot name of lower-case letters, digits and _ (max 63)"
            )


class TargetConfig(Endpoint, frozen=True):
    #: None: the source's slot name (Config fills it in).
    origin: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.origin is not None and not _NAME.match(self.origin):
            raise _Invalid("origin", "expected lower-case letters, digits and _ (max 63)")


class TablesConfig(_Section, frozen=True):
    include: list[str] = msgspec.field(default_factory=lambda: ["*.*"])
    exclude: list[str] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        for key in ("include", "exclude"):
            for p in getattr(self, key):
                try:
                    check_table_pattern(p)
                except ValueError as e:
                    raise _Invalid(key, str(e)) from None

    def includes(self, schema: str, table: str) -> bool:
        """True when ``schema.table`` matches an include pattern and no exclude pattern."""
        return any(table_matches(p, schema, table) for p in self.include) and not any(
            table_matches(p, schema, table) for p in self.exclude
        )


#: The conflict types (applier.apply.rules.conflicttype) and the policies each may take.
CONFLICT_POLICIES: dict[str, tuple[str, ...]] = {
    ConflictType.INSERT_EXISTS: ("error", "skip", "keep_local", "apply_remote", "last_update_wins"),
    ConflictType.UPDATE_EXISTS: ("error", "skip", "keep_local"),
    ConflictType.MULTIPLE_UNIQUE_CONFLICTS: ("error", "skip", "keep_local"),
    ConflictType.UPDATE_MISSING: ("error", "skip", "apply_remote"),
    ConflictType.DELETE_MISSING: ("error", "skip"),
    ConflictType.UPDATE_ORIGIN_DIFFERS: (
        "apply_remote", "error", "skip", "keep_local", "last_update_wins",
    ),
    ConflictType.DELETE_ORIGIN_DIFFERS: (
        "apply_remote", "error", "skip", "keep_local", "last_update_wins",
    ),
}  # fmt: skip
#: What applies where the config names nothing (PostgreSQL 18's subscriber behaves so;
#: the origin_differs types are only checked where the config names them).
DEFAULT_POLICIES: dict[str, str] = {
    ConflictType.INSERT_EXISTS: "error",
    ConflictType.UPDATE_EXISTS: "error",
    ConflictType.MULTIPLE_UNIQUE_CONFLICTS: "error",
    ConflictType.UPDATE_MISSING: "skip",
    ConflictType.DELETE_MISSING: "skip",
    ConflictType.UPDATE_ORIGIN_DIFFERS: "apply_remote",
    ConflictType.DELETE_ORIGIN_DIFFERS: "apply_remote",
}


def table_matches(pattern: str, schema: str, table: str) -> bool:
    """Whether ``schema.table`` matches a ``schema.table`` pattern (shell wildcards).

    The schema and table parts are matched apart, so a wildcard never crosses the
    dot (``my_schema.*`` does not take the schema ``my_schema.x``).
    """
    ps, _, pt = pattern.partition(".")
    return fnmatch.fnmatchcase(schema, ps) and fnmatch.fnmatchcase(table, pt)


def check_table_pattern(p: str) -> str:
    """``p`` if it is a ``[tables]`` pattern (``schema.table``, ``*`` allowed), else
    ValueError saying what to write; skip rules' ``--table`` is checked by it too."""
    if p.count(".") != 1 or not all(p.split(".")):
        raise ValueError(f"pattern {p!r}: expected schema.table, '*' allowed (e.g. 'sales.*')")
    return p


class ConflictsConfig:
    """``[conflicts]``: ``default`` and table patterns, each a table of type = policy."""

    __slots__ = ("root",)

    def __init__(self, root: Mapping[str, Mapping[str, str]] | None = None) -> None:
        root = {} if root is None else root
        if not isinstance(root, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Mapping) for k, v in root.items()
        ):
            raise TypeError("expected a table of tables (type = policy)")
        for key, policies in root.items():
            if key != "default":
                try:
                    check_table_pattern(key)
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
        self.root: dict[str, dict[str, str]] = {k: dict(v) for k, v in root.items()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConflictsConfig) and other.root == self.root

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ConflictsConfig({self.root!r})"

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


class ApplyConfig(_Section, frozen=True):
    streaming: Literal["on", "off", "parallel"] = "parallel"
    two_phase: bool = False
    binary: bool = False
    #: Bytes of a streamed transaction kept in memory (a size: 65536, '64MB').
    memory_limit: Size = 64 * 1024**2
    #: None: a private state directory (see applier.apply.handlers.spool.default_spool_dir).
    spool_dir: Path | None = None
    #: Bytes on disk a streamed transaction's spool may take; 0 = no limit.
    spool_limit: Size = 0
    synchronous_commit: Literal["on", "off", "local", "remote_write", "remote_apply"] = "off"
    status_interval: Annotated[float, Meta(gt=0)] = 10.0
    #: Seconds between the worker's "progress" log lines (never more often than
    #: status_interval, the thread that writes them wakes at that pace).
    progress_interval: Annotated[float, Meta(gt=0)] = 10.0
    #: Seconds of server silence before reconnecting.
    timeout: Annotated[float, Meta(gt=0)] = 60.0
    #: Seconds a target socket may stay silent while results are owed before the
    #: server is asked whether our backend still executes (applier/apply/target/connection.py,
    #: "A stalled connection").
    target_timeout: Annotated[float, Meta(ge=1)] = 60.0
    #: At most this many source transactions per target transaction; 1 = off.
    #: 1000: see "Group commit" in applier/apply/handlers/dispatch.py and bench/README-apply.md.
    group_commit: Annotated[int, Meta(ge=1)] = 1000
    #: Send only the final state of rows updated several times in a target
    #: transaction (applier/apply/batching/merge.py).
    merge_updates: bool = True
    #: Runs of this many INSERTs into one table use COPY; 0 = off. See
    #: applier/apply/sql/copyrun.py: a run this long pays for leaving the pipeline
    #: (bench/README-apply.md: 1000-row transactions, 4096 against 1000: 3.4 s vs 4.2 s).
    copy_threshold: Annotated[int, Meta(ge=0)] = 4096
    #: Target sessions applying transactions at once (parallel apply:
    #: applier/apply/parallel). 1: one session, as PostgreSQL's own subscriber.
    workers: Annotated[int, Meta(ge=1, le=64)] = 1
    #: With workers > 1: the leader's own session applies ordinary transactions
    #: itself while applier's CPU is the limit, the pool while the target is
    #: (applier/apply/parallel/lanes.py); false: the pool applies every one.
    adaptive: bool = True
    #: Tables (``schema.table``, ``*`` and ``?`` as in shell patterns) whose target
    #: triggers the operator trusts to touch only the row they fire for: with
    #: workers > 1 their transactions may run beside others (else they are barriers).
    trusted_triggers: list[str] = msgspec.field(default_factory=list)


class BootstrapConfig(_Section, frozen=True):
    spark_master: str = "local[*]"
    spark_conf: dict[str, str] = msgspec.field(default_factory=dict)
    slice_size: Size = 256 * 1024**2
    #: Copy tasks running at once, at most; None: as many as Spark runs
    #: (its task slots: the N of local[N], the executors' cores).
    parallelism: Annotated[int, Meta(ge=1)] | None = None
    #: For the post-data index builds, unless the target's own setting is higher.
    maintenance_work_mem: Size = 2 * 1024**3
    #: The driver JVM's class archive (see applier.bootstrap.spark): "auto"
    #: (a per-user cache file, used when `applier spark-archive` wrote it),
    #: "off", or a file path.
    class_archive: Annotated[str, Meta(min_length=1)] = "auto"
    #: The directory of the pg_dump and psql to run (of the source's major
    #: version or newer); None: found (applier.bootstrap.clients).
    client_bin_dir: Annotated[str, Meta(min_length=1)] | None = None
    #: Copy the large objects under the snapshot (applier.bootstrap.largeobjects);
    #: false: leave them to `applier cutover`, which copies them once writes stop.
    large_objects: bool = True
    #: On a Spark cluster (a master other than ``local``): the Python the
    #: executors run (it needs pyspark and psycopg); None: the cluster's own
    #: (``PYSPARK_PYTHON`` if set, else ``python3`` on the executors' PATH).
    #: A local master always runs the driver's own Python.
    executor_python: Annotated[str, Meta(min_length=1)] | None = None
    #: The DSNs the executors' tasks connect with, when the driver's are not
    #: reachable from them (``host=127.0.0.1`` means each executor's own host).
    #: None: ``[source] dsn`` / ``[target] dsn``. The driver's password (from the
    #: dsn, ``password_file`` or ``password_credential``) goes to a cluster's
    #: executors as a 0600 secret file shipped with the job, never in SparkConf
    #: (applier.bootstrap.executors).
    executor_source_dsn: Annotated[str, Meta(min_length=1)] | None = None
    executor_target_dsn: Annotated[str, Meta(min_length=1)] | None = None

    def __post_init__(self) -> None:
        for key in ("executor_source_dsn", "executor_target_dsn"):
            value = getattr(self, key)
            if value is None:
                continue
            try:
                conninfo_to_dict(value)
            except psycopg.ProgrammingError as e:
                detail = redact_conninfo_error(str(e))
                raise _Invalid(key, f"not a valid libpq connection string ({detail})") from None
        for key in self.spark_conf:
            if _ENV_SECRET.search(key):
                raise _Invalid(
                    "spark_conf",
                    f"{key}: a password in SparkConf is readable by anyone who can see the "
                    "job (UI, event log); give it with [source]/[target] password_file "
                    "(shipped as a 0600 file) or a passfile on the executors",
                )


#: SparkConf keys that would put a libpq password into an executor's or the
#: application master's environment (``spark.executorEnv.PGPASSWORD``).
_ENV_SECRET = re.compile(r"(?:executorEnv|appMasterEnv|driverEnv)\.PGPASSWORD$", re.IGNORECASE)


class LoggingConfig(_Section, frozen=True):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"
    #: Prefix each line with its syslog priority (<3> <4> <6> <7>) for journald (sd-daemon(3)).
    journald: bool = False


class StatusConfig(_Section, frozen=True):
    """``[status]``: when ``applier status`` calls the slot unhealthy (exit 5)."""

    # 16GB = 1024 WAL segments. PostgreSQL keeps a slot's WAL without bound by
    # default (max_slot_wal_keep_size = -1), so this is the alarm before the
    # source's disk fills. A caught-up worker retains little (its slot's
    # restart_lsn only lags by the oldest transaction still open on the source),
    # so 16GB does not trip on a healthy worker of a modest server or a long
    # source transaction, and still fires hours before a typical pg_wal volume
    # (100GB+) fills at a few MB/s. Set it to a fraction of the free space there.
    #: WAL bytes the slot may retain before status exits 5; 0 = no check.
    max_retained_wal: Size = 16 * 1024**3


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


class MetricsConfig(_Section, frozen=True):
    """``[metrics]``: the Prometheus endpoint of ``applier run`` (applier.apply.metrics)."""

    #: None: no endpoint.
    listen: str | None = None

    def __post_init__(self) -> None:
        if self.listen is not None:
            try:
                parse_listen(self.listen)
            except ValueError as e:
                raise _Invalid("listen", str(e)) from None

    @property
    def address(self) -> tuple[str, int] | None:
        return None if self.listen is None else parse_listen(self.listen)


class VerifyConfig(_Section, frozen=True):
    """``[verify]``: the load ``applier verify`` may put on both servers (applier.verify)."""

    #: Spark tasks hashing ranges at once (each holds one connection per server);
    #: None: as many as Spark runs at once (its task slots).
    parallelism: Annotated[int, Meta(ge=1)] | None = None
    #: Rows per key range of the first pass (the --chunk-rows default): one query
    #: and one snapshot a side. Fewer, larger ranges cost the servers less per
    #: row (5M rows, one run each: 100k 52 s, 1M 40 s, one range 44 s; see
    #: bench/README-verify.md), and ranges still run several at once.
    chunk_rows: Annotated[int, Meta(ge=100)] = 1_000_000
    #: A differing range is cut until it holds at most this many rows, then its
    #: (key, row hash) pairs are read from both sides and compared.
    fetch_rows: Annotated[int, Meta(ge=10)] = 500
    #: statement_timeout (and lock_timeout) of every verify query, seconds; 0 = none.
    statement_timeout: Annotated[float, Meta(ge=0)] = 600.0
    #: Seconds a range waits for the target to apply up to its source snapshot.
    catchup_timeout: Annotated[float, Meta(ge=0)] = 60.0


class DdlConfig(_Section, frozen=True):
    """``[ddl]``: how the worker replays DDL captured on the source (applier.ddl.classify)."""

    #: Replay a statement a function or DO block ran (its message carries the
    #: client's call, e.g. ``SELECT migrate()``, which then runs on the target as
    #: written and must exist there); refused (the worker stops) by default.
    allow_from_functions: bool = False


class SchemaConfig(_Section, frozen=True):
    """``[schema]``: what the worker does when the stream shows the source's schema
    changed (issue 33; applier/apply/handlers/follow.py)."""

    #: A column a Relation message names and the target lacks is added on the
    #: target (and a type widened in place), in the target transaction of the first
    #: change needing it; False: the worker stops with the ALTER TABLE to run.
    follow: bool = True


class Config(_Section, frozen=True):
    source: SourceConfig
    target: TargetConfig
    tables: TablesConfig = msgspec.field(default_factory=TablesConfig)
    apply: ApplyConfig = msgspec.field(default_factory=ApplyConfig)
    conflicts: ConflictsConfig = msgspec.field(default_factory=ConflictsConfig)
    bootstrap: BootstrapConfig = msgspec.field(default_factory=BootstrapConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    status: StatusConfig = msgspec.field(default_factory=StatusConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    verify: VerifyConfig = msgspec.field(default_factory=VerifyConfig)
    ddl: DdlConfig = msgspec.field(default_factory=DdlConfig)
    schema: SchemaConfig = msgspec.field(default_factory=SchemaConfig)
    #: The file it came from (set by load_config; not a key of the file).
    path: Path | None = None

    def __post_init__(self) -> None:
        if self.target.origin is None:
            target = msgspec.structs.replace(self.target, origin=self.source.slot)
            msgspec.structs.force_setattr(self, "target", target)

    @property
    def origin(self) -> str:
        assert self.target.origin is not None
        return self.target.origin


#: Keys that take a size (a number of bytes, or '64kB', '256MB', '1GB').
_SIZE_KEYS = (
    ("apply", "memory_limit"),
    ("apply", "spool_limit"),
    ("bootstrap", "slice_size"),
    ("bootstrap", "maintenance_work_mem"),
    ("status", "max_retained_wal"),
)
#: The sections a config file has; ``path`` is not one (load_config sets it).
SECTIONS = tuple(name for name in Config.__struct_fields__ if name != "path")


def section_keys(section: str) -> tuple[str, ...] | None:
    """The keys of ``[section]``; None for ``[conflicts]``, whose keys are table patterns."""
    kind = _key_type((section,))
    return None if kind is ConflictsConfig else kind.__struct_fields__


def is_table_key(section: str, key: str) -> bool:
    """Whether ``section.key`` takes a table (a third level of its own)."""
    return get_origin(_key_type((section, key))) is dict


def config_dict(cfg: Config) -> dict[str, Any]:
    """Every key's value, section by section, as plain data (for comparing configs)."""
    out: dict[str, Any] = msgspec.to_builtins(cfg, enc_hook=_encode)
    out.pop("path", None)
    return out


def _encode(obj: Any) -> Any:
    if isinstance(obj, ConflictsConfig):
        return obj.root
    if isinstance(obj, Path):
        return str(obj)
    raise NotImplementedError(type(obj).__name__)


def _decode(kind: type, obj: Any) -> Any:
    """msgspec's hook for types it does not know: the conflicts table, paths."""
    if kind is ConflictsConfig:
        return ConflictsConfig(obj)
    if kind is Path:
        if isinstance(obj, Path):
            return obj
        if isinstance(obj, str) and obj:
            return Path(obj)
        raise TypeError("expected a path (a non-empty string)")
    raise NotImplementedError(kind.__name__)


_KEYS = configenv.Keys(SECTIONS, section_keys, is_table_key)


def load_config(path: str | Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate a config file, then the ``APPLIER_*`` overrides of ``environ``
    (default: the process's; see :mod:`applier.configenv`), which win over the file.

    ``path`` None: the config comes from the environment alone. Errors are
    :class:`ConfigError` naming the key, and the variable when one set it.
    """
    found = configenv.overrides(os.environ if environ is None else environ, _KEYS)
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
        cfg = msgspec.convert(_sizes(raw), Config, dec_hook=_decode)
    except (msgspec.ValidationError, _BadKey) as e:
        loc, msg, missing = _where(e)
        key = ".".join(loc) or "(top level)"
        var = configenv.var_for(loc, env or [])
        if var is not None:
            raise ConfigError(f"{var} (sets {key}): {msg}") from None
        if missing and path is None and env:
            alt = f"it as {configenv.env_name(loc)}" if len(loc) > 1 else "its keys as APPLIER_*"
            msg += f" (pass --config PATH or set APPLIER_CONFIG, or give {alt})"
        inside = configenv.vars_within(loc, env or []) if loc else []
        if inside:
            msg += f" (keys in it set by {', '.join(inside)})"
        raise ConfigError(f"{where}: {key}: {msg}") from None
    msgspec.structs.force_setattr(cfg, "path", path)
    return cfg


class _BadKey(Exception):
    """A key's value that failed before msgspec saw it (a size)."""

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def _sizes(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with every size key's value in bytes ('64MB' -> 67108864)."""
    out = {k: v for k, v in raw.items() if k != "path"}
    for section, key in _SIZE_KEYS:
        table = out.get(section)
        if isinstance(table, dict) and key in table and isinstance(table[key], (int, str)):
            if isinstance(table[key], bool):
                continue  # msgspec names the type
            try:
                value = parse_size(table[key])
            except ValueError as e:
                raise _BadKey((section, key), str(e)) from None
            out[section] = {**table, key: value}
    return out


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_PART = re.compile(r"\.([^.\[]+)|\[(?:'([^']*)'|([^\]]*))\]")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]+)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<key>[^`]+)`$")


def _where(e: Exception) -> tuple[tuple[str, ...], str, bool]:
    """(key path, what is wrong in words, whether a required key is missing)."""
    if isinstance(e, _BadKey):
        return e.loc, str(e), False
    m = _AT.match(str(e))
    assert m is not None
    msg, path = m.group("msg"), m.group("path") or ""
    # msgspec writes a dict's key as [...]: the path stops at the dict.
    loc = tuple(p for a, b, c in _PART.findall(path) if (p := a or b or c) != "...")
    if (u := _UNKNOWN.match(msg)) is not None:
        return (*loc, u.group("key")), "unknown key (check its spelling and section)", False
    if (u := _MISSING.match(msg)) is not None:
        return (*loc, u.group("key")), "required key is missing", True
    key, sep, rest = msg.partition(_KEY_SEP)
    if sep:
        loc, msg = (*loc, key), rest
    elif msg.startswith("Invalid enum value "):
        allowed = get_args(_key_type(loc))
        msg = f"expected one of {', '.join(map(repr, allowed))}, got {msg[19:]}"
    msg = " ".join(msg.split())  # one line, whatever the check said
    msg = _TYPE_NAME.sub(lambda t: _TYPE_WORDS.get(t[1], t[1]), msg)
    return loc, msg[:1].lower() + msg[1:], False


_TYPE_NAME = re.compile(r"`([^`]*)`")
#: msgspec's type names, as a TOML file says them.
_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "a boolean (true or false)",
    "array": "a list",
    "object": "a table",
    "null": "nothing",
}


def _key_type(loc: tuple[str, ...]) -> Any:
    """The type a key path takes (a Literal's choices name what is allowed)."""
    kind: Any = Config
    for part in loc:
        if not isinstance(kind, type) or not issubclass(kind, msgspec.Struct):
            return None
        types = {f.name: f.type for f in msgspec.structs.fields(kind)}
        kind = types.get(part)
    while get_origin(kind) is Annotated:
        kind = get_args(kind)[0]
    return kind
