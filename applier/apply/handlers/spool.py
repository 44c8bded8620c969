"""Spooling of streamed (in-progress) transactions until their Stream Commit.

Streamed transactions
=====================

With ``streaming`` on, the walsender sends a large transaction in blocks
(Stream Start .. Stream Stop) long before it commits, interleaved with other
transactions and other streamed transactions. Nothing can be applied before
the Stream Commit (the transaction may still abort), so each top-level xid gets
a :class:`Spool`: changes (and the Relation/Type messages sent inside the
stream, which belong to the transaction's view of the schema, exactly as
worker.c spools them) are kept in memory up to ``memory_limit`` bytes, summed
over all open spools, and beyond that the largest in-memory spool moves to a
file ``<spool_dir>/<origin>-<xid>.spool``. What is kept is each message's
pgoutput bytes, exactly as received (:class:`~applier.protocol.StreamedChange`,
decoded only at replay), in the file as length-prefixed records; the file is
private, never shared and deleted at commit/abort, and the whole directory's
spools of this origin are removed at start (a restarted stream re-sends every
uncommitted transaction from its beginning, so an old spool is useless).

Subtransaction aborts: like worker.c's ``subxact_info_add``, the position
(message count and, once on disk, file offset) of each subtransaction's first
change is recorded; a Stream Abort naming a subxid truncates the spool back to
that position. Everything after a subtransaction's first change belongs to
it or to its descendants (one backend runs one subtransaction at a time, and
a later sibling can only start after it ended), so truncating is exact; it is
what worker.c's ``stream_abort`` does too. A change is recorded under the xid
it came with, except a captured DDL statement: pgoutput sends a message with
the top-level xid, so the capture writes its subtransaction's in the message
(:func:`~applier.apply.handlers.streamed.subxact_of`; "Its subtransaction" in
:mod:`applier.ddl.capture` says why that is exact).

The spool directory
===================

Spooled changes are the source's data: the directory is private. By default
it is a per-user state directory (:func:`default_spool_dir`:
``$STATE_DIRECTORY/spool`` under systemd's ``StateDirectory=``, else
``$XDG_STATE_HOME/applier/spool`` or ``~/.local/state/applier/spool``), never a
predictable path in a shared ``/tmp``. :func:`check_spool_dir` creates it 0700
and refuses one that is not a directory, is owned by another user or is
writable by group or others (someone else could plant files or symlinks), and
proves at start that a file can be created and written there. Files are opened
``O_CREAT|O_EXCL|O_NOFOLLOW`` with mode 0600, so a planted symlink or file is
never followed or reused (it is removed and the file created anew).

A write that fails (ENOSPC, a read-only or vanished directory, EIO) is one
:class:`~applier.errors.TransientError` line naming the file and the reason;
the transaction was not applied, nothing was confirmed, and the worker
retries (the stream sends the transaction again). ``[apply] spool_limit``
bounds the bytes one transaction's spool may take on disk; a transaction
beyond it stops the worker (exit 3: it would come again after a restart) with
the limit and the transaction named.

Rejected: one file per subtransaction (many files, ordering across them is
the hard part), and pickling decoded messages (measured: 11 us per row to
pickle and unpickle a slotted dataclass, on top of decoding it at receive
time; the bytes cost a write and one decode at replay).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from applier.errors import ConfigError, PermanentError, TransientError

_LEN = struct.Struct(">I")

#: Bytes counted per spooled message on top of its own (the bytes object, the list slot).
MESSAGE_OVERHEAD = 41


def message_size(data: bytes) -> int:
    """The memory a spooled message holds."""
    return MESSAGE_OVERHEAD + len(data)


class Spool:
    """The changes of one streamed top-level transaction, in order."""

    def __init__(self, xid: int, path: Path) -> None:
        self.xid = xid
        self.path = path
        self.count = 0
        self.mem: list[bytes] = []
        self.mem_bytes = 0
        self.file: IO[bytes] | None = None
        #: subxid -> (message count, file offset or -1) at its first change.
        self.subxacts: dict[int, tuple[int, int]] = {}
        #: Bytes in the file.
        self.disk_bytes = 0
        #: Not applied (its first block's Origin message, ``[source] origin = "none"``):
        #: its changes are not kept, its Stream Commit/Prepare discards it.
        self.filtered = False
        #: Applied as it arrives (applier.apply.handlers.streamed, "Live apply"): kept in memory
        #: only, as insurance, and never spilled: past the memory limit it is forgotten.
        self.live = False
        #: A live spool that was forgotten: it cannot be replayed.
        self.incomplete = False

    @property
    def on_disk(self) -> bool:
        return self.file is not None

    def add(self, msg: bytes, subxid: int | None) -> int:
        """Append a message; return the bytes it added to memory (0 once on disk)."""
        if subxid is not None and subxid != self.xid and subxid not in self.subxacts:
            self.subxacts[subxid] = (self.count, self.file.tell() if self.file else -1)
        self.count += 1
        if self.file is not None:
            self._write(msg)
            return 0
        self.mem.append(msg)
        size = message_size(msg)
        self.mem_bytes += size
        return size

    def add_many(self, msgs: list[bytes], subxid: int | None) -> int:
        """:meth:`add` each of ``msgs`` (changes of one subtransaction); return the
        bytes they added to memory."""
        if subxid is not None and subxid != self.xid and subxid not in self.subxacts:
            self.subxacts[subxid] = (self.count, self.file.tell() if self.file else -1)
        self.count += len(msgs)
        if self.file is not None:
            for msg in msgs:
                self._write(msg)
            return 0
        self.mem += msgs
        size = MESSAGE_OVERHEAD * len(msgs) + sum(map(len, msgs))
        self.mem_bytes += size
        return size

    def forget(self) -> int:
        """Drop what a live spool holds (it no longer fits); return the bytes freed."""
        freed = self.mem_bytes
        self.mem = []
        self.mem_bytes = 0
        self.subxacts.clear()
        self.incomplete = True
        return freed

    def _write(self, msg: bytes) -> None:
        assert self.file is not None
        try:
            self.file.write(_LEN.pack(len(msg)))
            self.file.write(msg)
        except OSError as e:
            raise spool_failed(self.path, "writing", e) from None
        self.disk_bytes += 4 + len(msg)

    def spill(self) -> int:
        """Move the in-memory messages to the file; return the bytes freed."""
        if self.file is not None:
            return 0
        self.file = os.fdopen(open_private(self.path), "w+b", buffering=1 << 20)
        # Translate the in-memory positions of subxacts into file offsets.
        starts = {pos: sub for sub, (pos, _) in self.subxacts.items()}
        for i, msg in enumerate(self.mem):
            sub = starts.get(i)
            if sub is not None:
                self.subxacts[sub] = (i, self.file.tell())
            self._write(msg)
        freed = self.mem_bytes
        self.mem = []
        self.mem_bytes = 0
        return freed

    def abort_subxact(self, subxid: int) -> int:
        """Drop the subtransaction's changes (and everything after); return memory freed."""
        pos = self.subxacts.get(subxid)
        if pos is None:
            return 0  # it had no changes
        count, offset = pos
        freed = 0
        if self.file is None:
            dropped = self.mem[count:]
            freed = sum(message_size(m) for m in dropped)
            del self.mem[count:]
            self.mem_bytes -= freed
        else:
            try:
                self.file.flush()
                self.file.seek(offset)
                self.file.truncate()
            except OSError as e:
                raise spool_failed(self.path, "truncating", e) from None
            self.disk_bytes = offset
        self.count = count
        self.subxacts = {s: p for s, p in self.subxacts.items() if p[0] < count}
        return freed

    def __iter__(self) -> Iterator[bytes]:
        if self.file is None:
            yield from self.mem
            return
        f = self.file
        try:
            f.flush()
            f.seek(0)
        except OSError as e:
            raise spool_failed(self.path, "writing", e) from None
        read = f.read
        for _ in range(self.count):
            (n,) = _LEN.unpack(read(4))
            yield read(n)

    def close(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.file = None
        self.mem = []
        self.mem_bytes = 0


class SpoolSet:
    """All open spools of one worker, with the shared memory limit."""

    def __init__(
        self, directory: Path, prefix: str, memory_limit: int, disk_limit: int = 0
    ) -> None:
        self.directory = directory
        self.prefix = prefix
        self.memory_limit = memory_limit
        #: Bytes one spool may take on disk (0: no limit).
        self.disk_limit = disk_limit
        self.spools: dict[int, Spool] = {}
        self.mem_bytes = 0
        self.spilled = 0  # how many spools went to disk (for tests and logs)

    def clear_stale(self) -> None:
        """Remove this origin's spool files left by an earlier process."""
        with contextlib.suppress(OSError):
            for p in self.directory.glob(f"{self.prefix}-*.spool"):
                with contextlib.suppress(OSError):
                    p.unlink()

    def open(self, xid: int, first_segment: bool) -> Spool:
        sp = self.spools.get(xid)
        if sp is not None and first_segment:
            self.discard(xid)
            sp = None
        if sp is None:
            sp = Spool(xid, self.directory / f"{self.prefix}-{xid}.spool")
            self.spools[xid] = sp
        return sp

    def add(self, spool: Spool, msg: bytes, subxid: int | None) -> None:
        if not spool.incomplete:
            self._added(spool, spool.add(msg, subxid))

    def add_many(self, spool: Spool, msgs: list[bytes], subxid: int | None) -> None:
        """:meth:`add` of a run of changes (a StreamedRun's), the limits checked once
        after it: a run is at most one read of the stream (client.MAX_BATCH_BYTES)."""
        if not spool.incomplete:
            self._added(spool, spool.add_many(msgs, subxid))

    def _added(self, spool: Spool, size: int) -> None:
        self.mem_bytes += size
        if self.disk_limit and spool.disk_bytes > self.disk_limit:
            self._over_limit(spool)
        if spool.live and self.mem_bytes > self.memory_limit:
            # Insurance that no longer fits: a live transaction is never written to disk.
            self.mem_bytes -= spool.forget()
        while self.mem_bytes > self.memory_limit:
            victim = max(
                (s for s in self.spools.values() if not s.on_disk and not s.live),
                key=lambda s: s.mem_bytes,
                default=None,
            )
            if victim is None:
                break
            self.mem_bytes -= victim.spill()
            self.spilled += 1
            if self.disk_limit and victim.disk_bytes > self.disk_limit:
                self._over_limit(victim)

    def _over_limit(self, spool: Spool) -> None:
        raise PermanentError(
            f"the streamed transaction {spool.xid} needs more than spool_limit = "
            f"{self.disk_limit} bytes on disk ({spool.path})",
            hint="raise [apply] spool_limit (and check the free space of spool_dir); "
            "nothing of this transaction was applied or confirmed",
            xid=spool.xid,
        )

    def get(self, xid: int) -> Spool | None:
        return self.spools.get(xid)

    def abort(self, xid: int, subxid: int) -> None:
        sp = self.spools.get(xid)
        if sp is None:
            return
        if subxid == xid:
            self.discard(xid)
        else:
            self.mem_bytes -= sp.abort_subxact(subxid)

    def discard(self, xid: int) -> None:
        sp = self.spools.pop(xid, None)
        if sp is not None:
            self.mem_bytes -= sp.mem_bytes
            sp.close()

    def close(self) -> None:
        for xid in list(self.spools):
            self.discard(xid)

    def __len__(self) -> int:
        return len(self.spools)

    def stats(self) -> dict[str, Any]:
        return {"open": len(self.spools), "mem_bytes": self.mem_bytes, "spilled": self.spilled}


def default_spool_dir() -> Path:
    """The private state directory's ``spool`` (see "The spool directory")."""
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        return Path(state.split(":")[0]) / "spool"
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "applier" / "spool"


def check_spool_dir(directory: Path) -> None:
    """Create ``directory`` 0700 if absent; refuse it unless private and writable."""
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
        st = os.lstat(directory)
    except OSError as e:
        raise _unusable(directory, e.strerror or str(e)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise _unusable(directory, "not a directory (a symlink is refused too)")
    if st.st_uid != os.geteuid():
        raise _unusable(directory, f"owned by uid {st.st_uid}, not by this user")
    if st.st_mode & 0o022:
        raise _unusable(directory, f"writable by others (mode {stat.S_IMODE(st.st_mode):o})")
    probe = directory / f".applier-probe-{os.getpid()}"
    try:
        fd = open_private(probe)
        try:
            os.write(fd, b"applier spool probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except (OSError, TransientError) as e:
        reason = e.strerror if isinstance(e, OSError) else str(e)
        raise _unusable(directory, f"cannot write a file there ({reason})") from None


def _unusable(directory: Path, why: str) -> ConfigError:
    return ConfigError(
        f"spool_dir {directory}: {why}",
        hint="use a private directory (mode 0700, owned by the user applier runs as) "
        "on a writable file system: [apply] spool_dir",
    )


def open_private(path: Path) -> int:
    """Create ``path`` 0600, never following or reusing what is there already."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            return os.open(path, flags, 0o600)
        except FileExistsError:
            os.unlink(path)  # a stale or planted file or symlink: unlink never follows
            return os.open(path, flags, 0o600)
    except OSError as e:
        raise spool_failed(path, "creating", e) from None


def spool_failed(path: Path, doing: str, e: OSError) -> TransientError:
    reason = os.strerror(e.errno) if e.errno else str(e)
    hint = (
        "free space on the spool file system or set [apply] spool_dir elsewhere"
        if e.errno == errno.ENOSPC
        else "check [apply] spool_dir: it must be a private, writable directory"
    )
    return TransientError(
        f"spool file {path}: {doing} failed: {reason}; the transaction was not applied",
        hint=hint,
    )
