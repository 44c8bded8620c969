"""Logging to stderr: one line per event, text for people or JSON for machines.

Context (lsn, xid, table...) goes in ``extra={"ctx": {...}}`` and is rendered
as ``key=value`` pairs or JSON fields; DSNs are logged only through
``applier.config.redact_dsn``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(record.created))
        head = f"{ts}.{int(record.msecs):03d} {record.levelname:<7} {record.name}"
        line = f"{head}: {record.getMessage()}"
        ctx = getattr(record, "ctx", None)
        if ctx:
            line += " " + " ".join(f"{k}={v}" for k, v in ctx.items())
        if record.exc_info and record.levelno >= logging.ERROR:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ctx = getattr(record, "ctx", None)
        if ctx:
            obj.update(
                {k: v if isinstance(v, int | float | bool) else str(v) for k, v in ctx.items()}
            )
        if record.exc_info and record.levelno >= logging.ERROR:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, ensure_ascii=False)


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Third-party chatter stays at warning unless we debug.
    for name in ("py4j", "alembic", "sqlalchemy"):
        logging.getLogger(name).setLevel(logging.WARNING if level != "debug" else logging.INFO)
