"""What every ``applier`` command shares: the --config option, loading the config
(and logging) from it, turning errors into exit codes, LSN parameters."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from .. import configenv
from ..config import Config, load_config
from ..errors import ApplierError
from ..log import log_fatal, setup_logging
from ..lsn import Lsn

F = TypeVar("F", bound=Callable[..., Any])

config_option = click.option(
    "--config",
    "config_path",
    envvar="APPLIER_CONFIG",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Path to the applier TOML config (see conf/applier.example.toml); "
    "default: $APPLIER_CONFIG. APPLIER_<SECTION>__<KEY> variables override its keys.",
)


def load_cfg(config_path: Path | None, log_level: str | None = None) -> Config:
    """The config (file and ``APPLIER_*`` variables), with logging set up from it
    (``log_level`` overrides its level); neither given is a usage error."""
    if config_path is None and not any(
        v.startswith(configenv.PREFIX) and v not in configenv.RESERVED for v in os.environ
    ):
        raise click.UsageError(
            "no configuration: pass --config PATH or set APPLIER_CONFIG "
            "(or give every required key as APPLIER_* variables)"
        )
    cfg = load_config(config_path)
    setup_logging(log_level or cfg.logging.level, cfg.logging.format, cfg.logging.journald)
    return cfg


def exits_cleanly(fn: F) -> F:
    """Turn ApplierError into one logged line (JSON object in JSON mode) and its exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            rc = fn(*args, **kwargs)
        except ApplierError as e:
            log_fatal(e, e.exit_code)
            sys.exit(e.exit_code)
        except KeyboardInterrupt as e:
            log_fatal(e, 130, "interrupted")
            sys.exit(130)
        sys.exit(rc or 0)

    return wrapper  # type: ignore[return-value]


def parse_lsn(ctx: click.Context, param: click.Parameter, value: str | None) -> Lsn | None:
    """An option's ``X/Y`` LSN (click callback); a bad one is a usage error naming it."""
    if value is None:
        return None
    try:
        return Lsn.parse(value)
    except ApplierError as e:
        raise click.BadParameter(str(e)) from None
