"""systemd's notify protocol: tell the service manager we are ready, alive, stopping.

sd_notify(3) in a few lines, without libsystemd: each notification is one
datagram of ``KEY=VALUE`` lines sent to the AF_UNIX SOCK_DGRAM socket named by
``$NOTIFY_SOCKET`` (a leading ``@`` means the abstract namespace). When the
variable is unset (not under systemd, or ``Type=simple``) every call is a
no-op, so the worker calls these unconditionally.

The watchdog: systemd sets ``$WATCHDOG_USEC`` (from ``WatchdogSec=``) and
``$WATCHDOG_PID``; it is ours only if that pid is ours (sd_watchdog_enabled(3)).
:meth:`Notifier.watchdog` sends ``WATCHDOG=1`` at most every half interval,
as sd_watchdog_enabled(3) recommends; *who* calls it, and when, decides what
"alive" means (see :mod:`applier.apply.beat`).

A send never raises: a service manager that went away must not stop the
replication; the failure is logged once at debug level.

SIGHUP (``systemctl reload``, ``ExecReload=/bin/kill -HUP $MAINPID``) ends in
:func:`reread_config`, called by the worker between two loop iterations (or
during a backoff), bracketed by ``RELOADING=1`` and ``READY=1``. Signals are
served when they come, also while the worker waits for the stream: see
:func:`signal_wakeup`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from applier.config import Config, config_dict, load_config
from applier.errors import ApplierError
from applier.log import setup_logging

log = logging.getLogger("applier.service")


def _address(value: str) -> str | bytes:
    # "@name" is the abstract namespace: a leading NUL byte instead of the "@".
    return b"\0" + value[1:].encode() if value.startswith("@") else value


class Notifier:
    """Sends sd_notify datagrams to ``$NOTIFY_SOCKET``; does nothing without it."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        path = env.get("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = _address(path) if path else None
        #: Seconds of the watchdog, None when systemd watches no one (or someone else).
        self.watchdog_interval: float | None = None
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6
        self._last_ping = float("-inf")
        self._failed = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> None:
        if self.address is None:
            return
        data = "\n".join(lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto(data, self.address)
        except OSError as e:
            if not self._failed:
                self._failed = True
                log.debug("sd_notify failed: %s", e)

    def ready(self, status: str | None = None) -> None:
        self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> None:
        self.send(f"STATUS={_one_line(text)}")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")

    def reloading(self) -> None:
        """``RELOADING=1`` with the clock systemd 253+ wants; READY=1 must follow."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def watchdog(self, now: float | None = None) -> None:
        """``WATCHDOG=1``, at most once per half watchdog interval."""
        if self.address is None or self.watchdog_interval is None:
            return
        now = time.monotonic() if now is None else now
        if now - self._last_ping >= self.watchdog_interval / 2:
            self._last_ping = now
            self.send("WATCHDOG=1")


def _one_line(text: str) -> str:
    return " ".join(text.split())


class Service:
    """The worker's side of systemd: its :class:`Notifier` and SIGHUP."""

    def __init__(self, cfg: Config, log_level: str | None = None) -> None:
        self.notify = Notifier()
        self.cfg = cfg
        self.log_level = log_level  # --log-level: wins over the file's, also on SIGHUP
        self._reload = threading.Event()

    def request_reload(self, *_: Any) -> None:
        """The SIGHUP handler: only a flag; the worker serves it at its next iteration.

        Not in the handler itself: it would run between any two bytecodes of
        the main thread, in the middle of a log call or a protocol exchange.
        """
        self._reload.set()

    def serve_reload(self) -> bool:
        """Serve a pending SIGHUP (RELOADING=1, re-read, READY=1); True if there was one."""
        if not self._reload.is_set():
            return False
        self._reload.clear()
        self.notify.reloading()
        reread_config(self.cfg, self.log_level)
        self.notify.ready("configuration reloaded")
        return True


def reread_config(running: Config, log_level: str | None = None) -> Config | None:
    """SIGHUP: re-read the config file; apply what can change without a restart.

    The log level, format and journald prefixes take effect at once (unless
    ``--log-level`` was given: the command line keeps its priority). Any other
    changed key is named in a warning and ignored until the next start. A
    file that no longer loads is an error in the log; the running
    configuration stays. Returns the new config, or None when it did not load.
    """
    try:
        new = load_config(running.path)  # and the same APPLIER_* overrides
    except ApplierError as e:
        log.error("configuration reload failed; the running configuration stays: %s", e)
        return None
    lc = new.logging
    setup_logging(log_level or lc.level, lc.format, lc.journald)
    changed = [k for k in changed_keys(running, new) if not k.startswith("logging.")]
    if changed:
        # Keys only: a value may be a DSN with a password.
        log.warning(
            "configuration reloaded; these changes need a restart and are ignored until then",
            extra={"ctx": {"keys": ",".join(changed)}},
        )
    log.info("configuration reloaded", extra={"ctx": {"level": log_level or lc.level}})
    return new


def changed_keys(old: Config, new: Config) -> list[str]:
    """``section.key`` of every value that differs between two configs."""
    a, b = _flat(config_dict(old)), _flat(config_dict(new))
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and not prefix:
            out.update(_flat(v, f"{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@contextmanager
def signal_wakeup() -> Iterator[socket.socket]:
    """A socket that becomes readable whenever a signal is handled.

    Python runs a signal handler between bytecodes, so a worker waiting in
    select() for the stream would see the stop flag only when the wait ends
    (up to half a second later). ``signal.set_wakeup_fd`` writes a byte for
    each signal to the other end, which the stream's select() also waits on.
    """
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    previous = signal.set_wakeup_fd(theirs.fileno(), warn_on_full_buffer=False)
    try:
        yield ours
    finally:
        signal.set_wakeup_fd(previous)
        ours.close()
        theirs.close()
