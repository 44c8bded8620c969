"""One error hierarchy for the whole package.

Every error the applier raises on purpose derives from :class:`ApplierError`.
Errors carry the replication context where it applies (LSN, xid, table, key,
SQLSTATE) so that the one line an operator sees says where and what, and
``str(err)`` always ends with a hint saying what to do when one is known.

Blame is split the way h11 splits it: :class:`ConfigError` is the user's input,
:class:`DecodeError` is bytes the peer sent that we cannot trust,
:class:`ApplyError` is the target refusing a change, and
:class:`TransientError` is anything worth retrying (connection loss, server
restart); only that branch is retried.

Exit codes mean the same in every command (``EXIT_*`` below): 0 ok, 1 a
transient failure (a restart may cure it: systemd restarts), 2 bad
configuration or usage (also a server refusing what the config names:
:mod:`applier.refusal`), 3 an error that a restart will not fix
(:class:`PermanentError`: an apply error, a missing slot, a different
source); ``conf/applier.service`` has ``RestartPreventExitStatus=2 3``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Stopped cleanly.
EXIT_OK = 0
#: A failure a restart may cure (connection lost, server restarting).
EXIT_TRANSIENT = 1
#: Bad configuration or command-line usage.
EXIT_USAGE = 2
#: Stopped on an error that a restart will not fix: a person must act.
EXIT_PERMANENT = 3


class ApplierError(Exception):
    """Base of every error raised by applier on purpose."""

    #: Process exit code the CLI uses when this error ends a command.
    exit_code: int = EXIT_TRANSIENT

    def __init__(self, message: str, *, hint: str | None = None, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # Only keep context that is set, so the rendered line stays short.
        self.context: dict[str, Any] = {k: v for k, v in context.items() if v is not None}

    def __str__(self) -> str:
        parts = [self.message]
        if self.context:
            parts.append("(" + ", ".join(f"{k}={_fmt(v)}" for k, v in self.context.items()) + ")")
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return " ".join(parts)


def _fmt(value: Any) -> str:
    return str(value)


class ConfigError(ApplierError):
    """The configuration file or a command-line value is wrong."""

    exit_code = EXIT_USAGE


class PermanentError(ApplierError):
    """An error a restart will not fix (exit 3): a person has to act first."""

    exit_code = EXIT_PERMANENT


class DecodeError(ApplierError):
    """Bytes from the server do not form a valid message.

    ``msg_type`` is the one-letter message tag (or a name) and ``offset`` the
    byte offset inside the message where decoding failed.
    """

    def __init__(
        self, message: str, *, msg_type: str | None = None, offset: int | None = None, **kw: Any
    ) -> None:
        super().__init__(message, msg_type=msg_type, offset=offset, **kw)
        self.msg_type = msg_type
        self.offset = offset


class ProtocolError(ApplierError):
    """The server sent a valid message in an order or state we cannot accept."""


class TransientError(ApplierError):
    """A failure that a retry may cure: lost connection, server restart, timeout."""


class ConnectionLost(TransientError):
    """The connection to a server broke (or the walsender was terminated)."""


class ServerTimeout(TransientError):
    """The server said nothing for longer than the configured liveness timeout."""


class ApplyError(PermanentError):
    """The target refused a change; the worker stops without advancing progress."""

    def __init__(
        self,
        message: str,
        *,
        lsn: str | None = None,
        xid: int | None = None,
        table: str | None = None,
        key: Any = None,
        sqlstate: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, lsn=lsn, xid=xid, table=table, key=key, sqlstate=sqlstate, **kw)
        self.lsn = lsn
        self.xid = xid
        self.table = table
        self.key = key
        self.sqlstate = sqlstate


class SchemaMismatch(ApplyError):
    """The target's tables or columns do not match what the source sends."""


class BootstrapError(ApplierError):
    """The bootstrap cannot go on; a rerun continues where it stopped."""


class BootstrapRefused(BootstrapError, PermanentError):
    """The bootstrap refuses what it found (non-empty or lacking target tables, a slot
    that exists, a pg_dump too old for the source): exit 3, a rerun finds it again."""


class AlreadyBootstrapped(BootstrapError, PermanentError):
    """The slot's bootstrap is done: `applier bootstrap --if-needed` exits 0 on it;
    without the flag exit 3 (a rerun finds it done again)."""


@dataclass
class ErrorRecord:
    """What ``applier status`` shows of the last error a worker stopped on."""

    kind: str
    message: str
    context: dict[str, Any] = field(default_factory=dict)
    #: What to do (the error's ``hint``), shown by ``applier status``.
    hint: str | None = None

    @classmethod
    def from_exc(cls, exc: BaseException) -> ErrorRecord:
        ctx = exc.context if isinstance(exc, ApplierError) else {}
        msg = exc.message if isinstance(exc, ApplierError) else str(exc)
        hint = exc.hint if isinstance(exc, ApplierError) else None
        return cls(
            kind=type(exc).__name__,
            message=msg,
            context={k: str(v) for k, v in ctx.items()},
            hint=hint,
        )


def describe_error_record(record: Any, *, leave_out: tuple[str, ...] = ()) -> str:
    """One line for a person from a stored :class:`ErrorRecord` (the jsonb of
    ``worker_status.last_error``): ``Kind: message (key=value, ...)``.

    ``leave_out``: context keys shown elsewhere (the skip command). A record
    of another shape is shown as it is, on one line.
    """
    if not isinstance(record, dict):
        return " ".join(str(record).split())
    context = {k: v for k, v in (record.get("context") or {}).items() if k not in leave_out}
    line = f"{record.get('kind')}: {record.get('message')}"
    if context:
        line += " (" + ", ".join(f"{k}={v}" for k, v in context.items()) + ")"
    return " ".join(line.split())  # a server message's DETAIL lines, joined


class SlotExists(ApplierError):
    """The replication slot to create exists already."""


class SlotMissing(PermanentError):
    """The replication slot to use does not exist (or is not the one we made)."""


class BootstrapUnfinished(PermanentError):
    """``applier run`` was started while a bootstrap of its slot is still unfinished."""


class SlotMoved(PermanentError):
    """The slot was advanced past the bootstrap's consistent point by another consumer."""


class SourceMismatch(PermanentError):
    """The source is not the one the target's origin was recorded from."""


class AnotherWorker(PermanentError):
    """Another ``applier run`` owns the replication origin (see applier.apply.target.holder)."""


class SourceError(ApplierError):
    """The source refused a command (missing publication, privileges, settings)."""


class SourceRefused(SourceError, PermanentError):
    """The source refuses for a reason only a person can change (a role without
    REPLICATION, ``wal_level`` not logical): exit 3, not retried."""
