"""applier.lag's arithmetic, without servers (the six places are tested in
tests/service/test_lag.py on real ones)."""

from __future__ import annotations

import datetime as dt

from applier.lag import NOT_RUNNING, Lag, PendingCommits, measure, not_running
from applier.lsn import Lsn, to_pg_timestamp

NOW = dt.datetime(2026, 11, 28, 12, 0, 0, tzinfo=dt.UTC)


def _ts(seconds_ago: float) -> int:
    return to_pg_timestamp(NOW - dt.timedelta(seconds=seconds_ago))


def test_nothing_pending_is_0_seconds_however_far_the_source_moved() -> None:
    assert measure(Lsn(1000), Lsn(900), None, NOW) == Lag(100, 0.0)


def test_pending_is_the_age_of_the_oldest_commit() -> None:
    since = NOW - dt.timedelta(seconds=12.5)
    assert measure(Lsn(1000), Lsn(900), since, NOW) == Lag(100, 12.5)


def test_nothing_left_in_bytes_is_0_seconds_whatever_an_older_report_said() -> None:
    since = NOW - dt.timedelta(seconds=30)
    assert measure(Lsn(900), Lsn(1000), since, NOW) == Lag(0, 0.0)  # never negative


def test_without_a_worker_the_seconds_are_unknown_unless_nothing_is_left() -> None:
    assert not_running(Lsn(1000), Lsn(900)) == Lag(100, None, NOT_RUNNING)
    assert not_running(Lsn(1000), Lsn(1000)) == Lag(0, 0.0)
    assert not_running(None, Lsn(1)) == Lag(None, None, NOT_RUNNING)
    assert "no worker running" in Lag(100, None, NOT_RUNNING).describe()
    assert Lag(0, 0.0).describe() == "0 B, 0.0 s"


def test_pending_commits_drop_what_the_done_position_passed() -> None:
    p = PendingCommits()
    assert p.oldest(Lsn(0)) is None
    p.received(Lsn(100), _ts(30))  # commit record starts at 100
    p.received(Lsn(200), _ts(20))
    p.received(Lsn(150), _ts(25))  # below the last: a resend after a reconnect
    assert len(p) == 2
    assert p.oldest(Lsn(100)) == NOW - dt.timedelta(seconds=30)  # done at 100: not past it
    assert p.oldest(Lsn(120)) == NOW - dt.timedelta(seconds=20)  # its commit's end passed
    assert p.oldest(Lsn(300)) is None
    assert len(p) == 0
