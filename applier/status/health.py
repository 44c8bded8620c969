"""The health verdict of ``applier status``: one exit code, a name, a reason, what to do.

The codes are status's own (a probe's, as a container HEALTHCHECK or a
monitoring check reads them); other commands keep the general 0/1/2/3:

====  ===============  ==========================================================
code  health           when
====  ===============  ==========================================================
0     ``healthy``      the worker runs: state running, heartbeat fresh; slot fine
1     ``unreachable``  the source or the target cannot be queried
5     ``slot``         the slot is missing or invalidated (``wal_status`` lost),
                       or retains more WAL than ``[status] max_retained_wal``
3     ``error``        the worker stopped on an error (state ``error``)
4     ``not_running``  no worker row, a worker stopped cleanly, or a heartbeat
                       older than three ``[apply] status_interval`` (a worker
                       killed with -9 leaves state ``running`` behind)
====  ===============  ==========================================================

When several hold, the first in the table's order wins (1, 5, 3, 4): a
server that cannot be reached hides the rest; a lost slot needs a
re-bootstrap whatever the worker does, so it outranks the worker's error.
2 stays bad configuration or usage, as for every command, and a server that
refuses the config (:mod:`applier.refusal`) is 2, not "unreachable".

The heartbeat's age is measured by the target's clock (``now() -
heartbeat_at`` in the query), so clock skew between hosts does not matter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import Config

if TYPE_CHECKING:
    from .report import Status

HEALTHY, UNREACHABLE, ERROR, NOT_RUNNING, SLOT = 0, 1, 3, 4, 5

#: A heartbeat older than this many status intervals is stale.
STALE_INTERVALS = 3

REBOOTSTRAP = "re-bootstrap with `applier bootstrap --recreate-slot --truncate`"


@dataclass(frozen=True)
class Health:
    code: int
    health: str
    reason: str
    hint: str | None = None


def assess(st: Status, cfg: Config) -> Health:
    """The first of 1, 5, 3, 4 that holds, else 0."""
    if not (st.source_reachable and st.target_reachable):
        down = [e for e in st.errors if "unreachable" in e]
        return Health(UNREACHABLE, "unreachable", "; ".join(down) or "a server is unreachable")
    return _slot(st, cfg) or _worker(st, cfg)


def _slot(st: Status, cfg: Config) -> Health | None:
    slot, name = st.slot, st.slot_name
    if slot is None:
        progress = (st.origin_progress or {}).get("remote_lsn")
        hint = (
            f"the origin has progress {progress}: the changes since are gone; {REBOOTSTRAP}"
            if progress
            else "`applier bootstrap` creates it (or `applier run`, for an origin without progress)"
        )
        return Health(SLOT, "slot", f"slot {name!r} does not exist on the source", hint)
    if slot.get("wal_status") == "lost":
        why = slot.get("invalidation_reason")
        return Health(
            SLOT,
            "slot",
            f"slot {name!r} is invalidated (wal_status lost"
            + (f", {why}" if why else "")
            + "): the source removed WAL the target still needs",
            f"{REBOOTSTRAP} (raise max_slot_wal_keep_size on the source if it was the cause)",
        )
    limit = cfg.status.max_retained_wal
    retained = slot.get("retained_bytes")
    if limit and retained is not None and retained > limit:
        return Health(
            SLOT,
            "slot",
            f"slot {name!r} retains {_size(retained)} of WAL on the source, more than "
            f"[status] max_retained_wal = {_size(limit)}",
            "start the worker, or see why it falls behind (lag, errors); a slot nobody "
            "will consume again: `applier drop --slot`",
        )
    return None


def _worker(st: Status, cfg: Config) -> Health:
    w = st.worker
    if w is None:
        return Health(
            NOT_RUNNING,
            "not_running",
            f"no worker has run for origin {st.origin!r} (no row in applier.worker_status)",
            "start `applier run` (or its service)",
        )
    state = w.get("state")
    if state == "error":
        return _stopped_on_error(st, w)
    if state == "stopped":
        return Health(
            NOT_RUNNING,
            "not_running",
            f"no worker running: it stopped cleanly at {w.get('heartbeat_at')}",
            "start `applier run` (or its service)",
        )
    age = w.get("heartbeat_age_s")
    stale = STALE_INTERVALS * cfg.apply.status_interval
    where = f"pid {w.get('pid')} on {w.get('host')}"
    if age is None or age > stale:
        return Health(
            NOT_RUNNING,
            "not_running",
            f"the worker's heartbeat ({where}) is "
            + ("missing" if age is None else f"{age:.0f} s old")
            + f", stale after {STALE_INTERVALS} x [apply] status_interval = {stale:g} s: "
            "it was killed or it hangs",
            "check the process and its log; restart it (`systemctl restart` or `applier run`)",
        )
    return Health(HEALTHY, "healthy", f"the worker runs ({where}, heartbeat {age:.0f} s ago)")


def _stopped_on_error(st: Status, w: dict[str, Any]) -> Health:
    err = w.get("last_error")
    if isinstance(err, dict):
        what = f"{err.get('kind')}: {err.get('message')}"
        # The skip command, if any, is in the hint: not twice on the line.
        context = {k: v for k, v in (err.get("context") or {}).items() if k != "skip_command"}
        if context:
            what += " (" + ", ".join(f"{k}={v}" for k, v in context.items()) + ")"
        hint = err.get("hint")
    else:
        what, hint = (json.dumps(err) if err is not None else "unknown error"), None
    todo = [hint] if hint else ["fix the cause on the target"]
    if st.skip_rule is not None:
        todo = [f"skip rule {st.skip_rule} skips that transaction"]
    elif st.skip_command is not None and st.skip_command not in (hint or ""):
        todo.append(f"or skip that transaction: {st.skip_command}")
    todo.append("then start the worker (it resumes from the origin's progress)")
    return Health(
        ERROR,
        "error",
        f"the worker stopped on an error at {w.get('last_error_at')}: {what}",
        "; ".join(todo),
    )


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.1f} TB"
