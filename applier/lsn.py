"""Log sequence numbers and PostgreSQL-epoch timestamps, converted in one place.

An LSN travels as a 64-bit integer in the protocol and as ``XXX/XXXXXXXX`` in
SQL and logs. :class:`Lsn` is an ``int`` so comparisons and arithmetic cost
nothing, and it prints itself the way PostgreSQL does.
"""

from __future__ import annotations

import datetime as _dt

from .errors import ApplierError


class Lsn(int):
    """A WAL position. ``Lsn(0)`` is InvalidXLogRecPtr."""

    __slots__ = ()

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Parse ``'16/B374D848'``; raise :class:`ApplierError` naming the bad text."""
        hi, sep, lo = text.strip().partition("/")
        try:
            if not sep or not hi or not lo or len(hi) > 8 or len(lo) > 8:
                raise ValueError
            return cls((int(hi, 16) << 32) | int(lo, 16))
        except ValueError:
            raise ApplierError(
                f"invalid LSN {text!r}", hint="write an LSN as two hex numbers, e.g. 0/16B3748"
            ) from None

    def __str__(self) -> str:
        return f"{self >> 32:X}/{self & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"


INVALID_LSN = Lsn(0)

#: Microseconds between the Unix epoch and PostgreSQL's (2000-01-01 UTC).
PG_EPOCH_OFFSET_US = 946_684_800_000_000
PG_EPOCH = _dt.datetime(2000, 1, 1, tzinfo=_dt.UTC)


def pg_timestamp(us: int) -> _dt.datetime:
    """A protocol timestamp (microseconds since 2000-01-01 UTC) as an aware datetime."""
    return PG_EPOCH + _dt.timedelta(microseconds=us)


def to_pg_timestamp(ts: _dt.datetime) -> int:
    """An aware datetime as microseconds since the PostgreSQL epoch."""
    delta = ts - PG_EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def now_pg_timestamp() -> int:
    return to_pg_timestamp(_dt.datetime.now(_dt.UTC))
