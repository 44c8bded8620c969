"""Logging to stderr: one line per event, text for people or JSON for machines.

Context (lsn, xid, table...) goes in ``extra={"ctx": {...}}`` and is rendered
as ``key=value`` pairs or JSON fields; DSNs are logged only through
``applier.redact.redact_dsn``.

Timestamps are ISO 8601 in UTC with the zone written out
(``2026-11-22T10:11:12.345+00:00``), in both forms. With ``[logging]
journald = true`` each line starts with its syslog priority (``<3>`` error,
``<4>`` warning, ``<6>`` info, ``<7>`` debug; every line of a multi-line
record, e.g. a traceback), the prefix sd-daemon(3) describes: journald,
capturing stderr, files each line at that priority and strips the prefix
(``journalctl -p warning`` then works).

The error that ends a command goes through here too (:func:`log_fatal`, called
by the CLI): one line, or one JSON object carrying the error's fields (kind,
exit code, hint, lsn, xid, table...). When the command died before logging
was set up (the config did not load), a default text logger is set up first,
so the line has the same form as every other.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
from typing import Any

#: sd-daemon(3) priorities: SD_ERR, SD_WARNING, SD_INFO, SD_DEBUG.
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4}


def _priority(levelno: int) -> int:
    return 3 if levelno >= logging.ERROR else _PRIORITY.get(levelno, 6 if levelno > 10 else 7)


def iso_ts(created: float) -> str:
    """``2026-11-22T10:11:12.345+00:00``: UTC, milliseconds, the zone written out."""
    return _dt.datetime.fromtimestamp(created, _dt.UTC).isoformat(timespec="milliseconds")


class _Formatter(logging.Formatter):
    def __init__(self, journald: bool = False) -> None:
        super().__init__()
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        line = self.render(record)
        if not self.journald:
            return line
        # Every line: journald files each line of stderr as an entry of its own.
        prefix = f"<{_priority(record.levelno)}>"
        return "\n".join(prefix + part for part in line.split("\n"))

    def render(self, record: logging.LogRecord) -> str:
        raise NotImplementedError


class _TextFormatter(_Formatter):
    def render(self, record: logging.LogRecord) -> str:
        head = f"{iso_ts(record.created)} {record.levelname:<7} {record.name}"
        line = f"{head}: {record.getMessage()}"
        ctx = getattr(record, "ctx", None)
        if ctx and getattr(record, "fatal", None) is None:
            line += " " + " ".join(f"{k}={v}" for k, v in ctx.items())
        if record.exc_info and record.levelno >= logging.ERROR:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _JsonFormatter(_Formatter):
    def render(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": iso_ts(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            # A fatal error's msg is its bare message; the rest are fields.
            "msg": getattr(record, "fatal", None) or record.getMessage(),
        }
        ctx = getattr(record, "ctx", None)
        if ctx:
            obj.update(
                {k: v if isinstance(v, int | float | bool) else str(v) for k, v in ctx.items()}
            )
        if record.exc_info and record.levelno >= logging.ERROR:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, ensure_ascii=False)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Ours (so a second setup reconfigures it instead of adding another)."""


def setup_logging(level: str = "info", fmt: str = "text", journald: bool = False) -> None:
    """Log to stderr at ``level`` in ``fmt``; called again (SIGHUP) it reconfigures in place."""
    root = logging.getLogger()
    formatter = _JsonFormatter(journald) if fmt == "json" else _TextFormatter(journald)
    ours = [h for h in root.handlers if isinstance(h, _Handler)]
    if ours and len(root.handlers) == 1:
        ours[0].setFormatter(formatter)  # the same handler: no line lost or doubled
    else:
        handler = _Handler(sys.stderr)
        handler.setFormatter(formatter)
        root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Third-party chatter stays at warning unless we debug.
    for name in ("py4j", "alembic", "sqlalchemy"):
        logging.getLogger(name).setLevel(logging.WARNING if level != "debug" else logging.INFO)


def logging_is_set_up() -> bool:
    return any(isinstance(h, _Handler) for h in logging.getLogger().handlers)


def log_fatal(exc: BaseException, exit_code: int, message: str | None = None) -> None:
    """Log the error that ends a command: one line, or one JSON object with its fields.

    Text: ``<ts> ERROR   applier: error: <message (context) hint: ...>``; JSON:
    ``msg`` is the bare message and the error's kind, exit code, hint and
    context (lsn, xid, table, key, sqlstate...) are fields of their own.
    """
    if not logging_is_set_up():
        setup_logging("info", "text")
    hint = getattr(exc, "hint", None)
    context = getattr(exc, "context", None) or {}
    fields: dict[str, Any] = {"error": type(exc).__name__, "exit_code": exit_code}
    if hint:
        fields["hint"] = hint
    fields.update({k: v for k, v in context.items() if k not in fields})
    bare = getattr(exc, "message", None) or str(exc)
    # Text: str(exc) -- message, context and hint in one readable line, no
    # key=value repeat; JSON: the bare message, the fields as fields.
    # One line whatever the error holds: a server's message may carry a DETAIL on a
    # line of its own, which a reader of the log (or journalctl -o cat) would lose.
    line = " ".join((message or f"error: {exc}").split())
    logging.getLogger("applier").error("%s", line, extra={"ctx": fields, "fatal": bare})
