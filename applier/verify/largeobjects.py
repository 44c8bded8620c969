"""Verify's comparison of large objects (:mod:`applier.largeobjects`), reported like a table.

Each server lists its objects with their owner, ACL text, size and a hash of
the data computed in the server (piece by piece: :data:`applier.largeobjects.CHUNK`),
both at once; the objects that differ (or that one side lacks) are reported as
differing rows of ``pg_catalog.pg_largeobject``, keyed by ``oid``, each side
showing what it has. One pass, no rounds: the stream never carries large
objects, so a difference found here stays until ``applier cutover`` (or a
person) syncs them; during replication every object written since the
bootstrap is one, and cutover's sync is what removes it.

Only when ``--tables`` is not given or one of its patterns names
``pg_catalog.pg_largeobject``; a database without large objects on either
side adds no line to the report.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict

from .. import largeobjects as lo
from ..config import Config, table_matches
from .report import Diff, TableReport

log = logging.getLogger(__name__)

#: The name the objects are reported under.
TABLE = "pg_catalog.pg_largeobject"


def wanted(patterns: list[str] | None) -> bool:
    return not patterns or any(table_matches(p, "pg_catalog", "pg_largeobject") for p in patterns)


def compare(cfg: Config, patterns: list[str] | None, max_diffs: int) -> dict[str, TableReport]:
    """The large objects' report (``{TABLE: report}``), or nothing when neither side has any."""
    from .hashing import connect

    if not wanted(patterns):
        return {}
    started = time.monotonic()
    timeout = cfg.verify.statement_timeout
    with (
        connect(cfg.source.conninfo(), "source", timeout) as src,
        connect(cfg.target.conninfo(), "target", timeout) as tgt,
    ):
        s, t = lo.both_digests(lambda: lo.digests(src), lambda: lo.digests(tgt))
    if not s and not t:
        return {}
    rep = TableReport(TABLE, keyed=True, rows=len(s), ranges=1)
    differing = sorted(o for o in s.keys() | t.keys() if s.get(o) != t.get(o))
    rep.differences = [
        Diff(TABLE, (str(o),), {"oid": o}, _side(s.get(o)), _side(t.get(o)))
        for o in differing[:max_diffs]
    ]
    rep.truncated = len(differing) > max_diffs
    rep.seconds = time.monotonic() - started
    log.info(
        "verify: large objects compared",
        extra={"ctx": {"source": len(s), "target": len(t), "differing": len(differing)}},
    )
    return {TABLE: rep}


def _side(d: lo.Digest | None) -> dict[str, object] | None:
    return None if d is None else asdict(d)
