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
what worker.c's ``stream_abort`` does too.

Rejected: one file per subtransaction (many files, ordering across them is
the hard part), and pickling decoded messages (measured: 11 us per row to
pickle and unpickle a slotted dataclass, on top of decoding it at receive
time; the bytes cost a write and one decode at replay).
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

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

    def _write(self, msg: bytes) -> None:
        assert self.file is not None
        self.file.write(_LEN.pack(len(msg)))
        self.file.write(msg)

    def spill(self) -> int:
        """Move the in-memory messages to the file; return the bytes freed."""
        if self.file is not None:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.file = os.fdopen(fd, "w+b", buffering=1 << 20)
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
            self.file.flush()
            self.file.seek(offset)
            self.file.truncate()
        self.count = count
        self.subxacts = {s: p for s, p in self.subxacts.items() if p[0] < count}
        return freed

    def __iter__(self) -> Iterator[bytes]:
        if self.file is None:
            yield from self.mem
            return
        f = self.file
        f.flush()
        f.seek(0)
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

    def __init__(self, directory: Path, prefix: str, memory_limit: int) -> None:
        self.directory = directory
        self.prefix = prefix
        self.memory_limit = memory_limit
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
        self.mem_bytes += spool.add(msg, subxid)
        while self.mem_bytes > self.memory_limit:
            victim = max(
                (s for s in self.spools.values() if not s.on_disk),
                key=lambda s: s.mem_bytes,
                default=None,
            )
            if victim is None:
                break
            self.mem_bytes -= victim.spill()
            self.spilled += 1

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
