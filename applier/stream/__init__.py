"""The stream layer: a replication connection, the pgoutput stream on it, and a slot read
without consuming it (what ``applier decode`` prints).

* :mod:`.replconn` - :class:`ReplicationConnection`: replication commands
  (IDENTIFY_SYSTEM, CREATE/DROP_REPLICATION_SLOT) over psycopg 3's simple
  protocol, server errors mapped to applier errors with hints.
* :mod:`.client` - :class:`LogicalStream`: START_REPLICATION, non-blocking
  CopyData reading through selectors, keepalives, feedback of confirmed LSNs.
* :mod:`.negotiate` - :func:`negotiate`: the START_REPLICATION options fitted
  to the source's version, every downgrade logged, pure.
* :mod:`.peek` - :func:`~.peek.run_decode`: print a slot's stream, never advance the
  slot (the command line is :mod:`applier.cli.decode`).
* :mod:`.versions` - what each source version supports (protocol, options,
  slot syntax, catalog columns), pure.
"""

from .client import LogicalStream, max_proto_version
from .negotiate import StreamOptions, negotiate
from .replconn import ReplicationConnection, SlotInfo, SystemInfo, quote_ident, quote_literal

__all__ = [
    "LogicalStream",
    "ReplicationConnection",
    "SlotInfo",
    "StreamOptions",
    "SystemInfo",
    "max_proto_version",
    "negotiate",
    "quote_ident",
    "quote_literal",
]
