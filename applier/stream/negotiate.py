"""What START_REPLICATION asks for: the requested options fitted to the source.

:func:`negotiate` takes the options the configuration asks for and the
source's version, and returns what is sent: the highest protocol both speak,
streaming and two-phase only where that protocol has them, the origin option
only where pgoutput accepts it. Every downgrade is logged once, with what it
means for the user; a protocol version the source cannot speak is an error.
No I/O: the stream client (:mod:`applier.stream.client`) sends the result.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from applier.errors import ApplierError
from applier.lsn import INVALID_LSN, Lsn
from applier.stream.replconn import quote_ident, quote_literal
from applier.stream.versions import features, max_proto_version

__all__ = ["Negotiated", "StreamOptions", "negotiate", "start_replication_sql"]

log = logging.getLogger("applier.stream")


@dataclass(frozen=True)
class StreamOptions:
    """What to ask START_REPLICATION for; unsupported options are negotiated down."""

    slot: str
    publications: Sequence[str]
    start_lsn: Lsn = INVALID_LSN  # 0: the slot's confirmed_flush_lsn
    proto_version: int | None = None  # None: the highest the server speaks
    binary: bool = False
    messages: bool = True
    streaming: Literal["off", "on", "parallel"] = "off"
    two_phase: bool = False
    origin: Literal["any", "none"] | None = None  # sent only where supported (PG16+)
    status_interval: float = 10.0
    timeout: float = 60.0  # seconds of server silence -> ServerTimeout
    report_flush: bool = True  # False: flush/apply reported as 0/0, the slot never advances
    #: Changes inside stream blocks come as StreamedChange bytes (the apply worker spools them).
    defer_streamed: bool = False
    #: With defer_streamed: runs of streamed row changes of one head come as one
    #: StreamedRun, runs of Inserts into one relation outside stream blocks as one
    #: InsertRun (C read loop only; the pure-Python loop hands each over alone).
    group_streamed: bool = False


@dataclass(frozen=True)
class Negotiated:
    proto_version: int
    streaming: str
    two_phase: bool
    options: tuple[tuple[str, str], ...]  # START_REPLICATION plugin options, in order


def negotiate(server_version: int, opts: StreamOptions) -> Negotiated:
    """Fit the requested options to what the server supports; log every downgrade."""
    top = max_proto_version(server_version)
    proto = opts.proto_version or top
    if not 1 <= proto <= top:
        raise ApplierError(
            f"proto_version {proto} is not supported by the source (PostgreSQL "
            f"{server_version // 10000} speaks 1..{top})",
            hint="leave proto_version unset to use the highest the server speaks",
        )
    streaming = _negotiate_streaming(opts.streaming, proto)
    two_phase = opts.two_phase
    if two_phase and proto < 3:
        log.warning(
            "two_phase needs proto_version 3 (PostgreSQL 15+); decoding prepared "
            "transactions at commit instead",
            extra={"ctx": {"proto_version": proto}},
        )
        two_phase = False
    pubs = ",".join(quote_ident(p) for p in opts.publications)
    out: list[tuple[str, str]] = [("proto_version", str(proto)), ("publication_names", pubs)]
    feats = features(server_version)
    if feats.binary:
        out.append(("binary", _bool(opts.binary)))
        out.append(("messages", _bool(opts.messages)))
    elif opts.binary:
        log.warning("binary needs a PostgreSQL 14+ source; values come as text")
    if streaming != "off":
        out.append(("streaming", streaming))
    if two_phase:
        out.append(("two_phase", "true"))
    if opts.origin is not None:
        if feats.origin_option:
            out.append(("origin", opts.origin))
        elif opts.origin == "none":
            # pgoutput 15 refuses the option; the apply worker filters the transactions
            # that arrive with an Origin message (applier.apply.rules.originfilter).
            log.info(
                "the source filters by origin from PostgreSQL 16; transactions with an "
                "origin are streamed and filtered here",
                extra={"ctx": {"origin": opts.origin}},
            )
    return Negotiated(proto, streaming, two_phase, tuple(out))


def _negotiate_streaming(requested: str, proto: int) -> str:
    if requested == "off":
        return "off"
    if proto < 2:
        log.warning(
            "streaming needs proto_version 2 (PostgreSQL 14+); large transactions "
            "are sent at commit instead"
        )
        return "off"
    if requested == "parallel" and proto < 4:
        # Protocol 4 only adds the abort LSN to Stream Abort; applier applies streamed
        # transactions as they arrive either way (applier.apply.handlers.streamed, "Live apply").
        log.debug(
            "the source streams as with streaming=on (protocol 4 needs PostgreSQL 16+)",
            extra={"ctx": {"proto_version": proto}},
        )
        return "on"
    # Before protocol 4 the option is a boolean; "on" is accepted by every version.
    return requested


def _bool(flag: bool) -> str:
    return "true" if flag else "false"


def start_replication_sql(slot: str, start_lsn: Lsn, options: Sequence[tuple[str, str]]) -> str:
    opts = ", ".join(f"{name} {quote_literal(value)}" for name, value in options)
    return f"START_REPLICATION SLOT {quote_ident(slot)} LOGICAL {Lsn(start_lsn)} ({opts})"
