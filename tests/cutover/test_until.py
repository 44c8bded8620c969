"""``applier run --until-lsn`` / ``--until-caught-up``: exactly the transactions ending <= LSN."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ONE_PAIR, Pair

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apply"))
from applykit import ROOT, Runner, origin_lsn


def _setup(pair: Pair, **apply: object) -> Path:
    """Table, publication, slot and origin (one short run); what follows is a backlog."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    cfg = pair.write_config(apply=dict(apply)) if apply else pair.write_config()
    runner = Runner(pair, cfg)
    runner.start().ready()
    assert runner.stop() == 0
    return cfg


def _insert(pair: Pair, ids: range) -> None:
    for i in ids:  # one source transaction each
        pair.pub_exec(f"INSERT INTO t VALUES ({i}, 'v{i}')")


def _commit_ends(pair: Pair) -> list[int]:
    """The end LSN of every pending transaction's commit, in order (peeked, not consumed)."""
    rows = pair.pub_exec(
        f"SELECT lsn - '0/0'::pg_lsn FROM pg_logical_slot_peek_binary_changes('{pair.slot}', "
        "NULL, NULL, 'proto_version', '1', 'publication_names', 'pub') "
        "WHERE get_byte(data, 0) = 67"  # 'C': Commit, at its end_lsn
    )
    return [int(r[0]) for r in rows]


def _group_lsn(pair: Pair) -> str | None:
    """The progress of the origin and its parallel sessions' origins, the largest."""
    row = pair.sub_exec(
        "SELECT max(pg_replication_origin_progress(roname, true))::text "
        f"FROM pg_replication_origin WHERE roname = '{pair.slot}' OR roname LIKE '{pair.slot}.%'"
    )
    return None if not row else row[0][0]


def _lsn(n: int) -> str:
    return f"{n >> 32:X}/{n & 0xFFFFFFFF:X}"


def _num(lsn: str | None) -> int:
    assert lsn is not None
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _run(cfg: Path, *args: str, timeout: float = 60) -> tuple[int, str, float]:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "applier.cli", "run", "--config", str(cfg), *args],
            capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"run {args} did not stop:\n{e.stderr!r}") from None
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    return proc.returncode, out, time.monotonic() - t0


def _ids(pair: Pair) -> list[int]:
    return [r[0] for r in pair.sub_exec("SELECT id FROM t ORDER BY id")]


def _confirmed(pair: Pair) -> int:
    rows = pair.pub_exec(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
        f"WHERE slot_name = '{pair.slot}'"
    )
    return _num(rows[0][0])


# Where the worker stops is read from the source's commit LSNs (15 on both default
# pairs); the target only keeps the origin, alike on 15 and 18 (the 2PC test below,
# which leaves a PREPARE on the target, keeps both).
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
@pytest.mark.parametrize(
    "apply",
    [{"workers": 1}, {"workers": 4, "adaptive": False}, {"workers": 4}],
    ids=["one session", "pool", "pool or inline"],
)
def test_until_lsn_stops_exactly_there_and_continues(pair: Pair, apply: dict[str, object]) -> None:
    """With parallel apply too: the pool stops at the same place, its progress is the
    group's (the largest of the origin and its sessions'); so does the leader's own
    session when it takes the transactions inline (adaptive, the default)."""
    cfg = _setup(pair, **apply)
    _insert(pair, range(1, 6))
    mid = pair.pub_exec("SELECT pg_current_wal_lsn()::text")[0][0]
    _insert(pair, range(6, 11))
    ends = _commit_ends(pair)
    assert len(ends) == 10

    # A position between two transactions: exactly the first five.
    rc, out, _ = _run(cfg, "--until-lsn", mid)
    assert rc == 0, out
    assert _ids(pair) == [1, 2, 3, 4, 5]
    assert _num(_group_lsn(pair)) == ends[4]
    assert ends[4] <= _confirmed(pair) < ends[5]

    # A commit's own end is included; a later run continues from the origin.
    rc, out, _ = _run(cfg, "--until-lsn", _lsn(ends[6]))
    assert rc == 0, out
    assert _ids(pair) == [1, 2, 3, 4, 5, 6, 7]
    assert _num(_group_lsn(pair)) == ends[6]

    # A position inside a commit record (past its start, before its end): not applied.
    rc, out, _ = _run(cfg, "--until-lsn", _lsn(ends[8] - 1))
    assert rc == 0, out
    assert _ids(pair) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert _num(_group_lsn(pair)) == ends[7]
    assert ends[7] <= _confirmed(pair) < ends[8]

    # Nothing was lost by confirming: the rest follows.
    rc, out, _ = _run(cfg, "--until-caught-up")
    assert rc == 0, out
    assert _ids(pair) == list(range(1, 11))
    assert _num(_group_lsn(pair)) == ends[9]


# The source's position decides (15 on both default pairs), not the target's version.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_until_caught_up_on_an_idle_source_exits_promptly(pair: Pair) -> None:
    cfg = _setup(pair)
    rc, out, took = _run(cfg, "--until-caught-up")
    assert rc == 0, out
    assert took < 15, took
    _insert(pair, range(1, 4))
    rc, out, took = _run(cfg, "--until-caught-up")
    assert rc == 0, out
    assert _ids(pair) == [1, 2, 3]
    assert took < 15, took
    # Caught up: the source's position then is confirmed (the slot is not held back).
    now = _num(pair.pub_exec("SELECT pg_current_wal_lsn()::text")[0][0])
    rc, out, took = _run(cfg, "--until-caught-up")
    assert rc == 0, out
    assert _confirmed(pair) >= now


# The group is closed at the source's commit LSN (15 on both default pairs); the
# target's transactions are plain ones on 15 and 18 alike.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_group_commit_does_not_cross_the_position(pair: Pair) -> None:
    cfg = _setup(pair, group_commit=50)
    _insert(pair, range(1, 201))
    ends = _commit_ends(pair)
    assert len(ends) == 200
    rc, out, _ = _run(cfg, "--until-lsn", _lsn(ends[119]))
    assert rc == 0, out
    assert _ids(pair) == list(range(1, 121))
    assert _num(origin_lsn(pair, pair.slot)) == ends[119]
    # It did group (fewer target transactions than source ones).
    assert pair.sub_exec("SELECT count(DISTINCT xmin::text) FROM t")[0][0] < 100
    # Inside the next commit record, with a group open before it.
    rc, out, _ = _run(cfg, "--until-lsn", _lsn(ends[150] - 1))
    assert rc == 0, out
    assert _ids(pair) == list(range(1, 151))
    assert _num(origin_lsn(pair, pair.slot)) == ends[149]


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_until_options_exclude_each_other(pair: Pair) -> None:
    cfg = pair.write_config()
    rc, out, _ = _run(cfg, "--until-lsn", "0/1", "--until-caught-up")
    assert rc == 2, out
    rc, out, _ = _run(cfg, "--until-lsn", "nonsense")
    assert rc == 2, out


@ONE_PAIR
def test_until_lsn_with_streamed_and_prepared_transactions(pair: Pair) -> None:
    """A streamed transaction follows the rule at its Stream Commit; a PREPARE before the
    position whose COMMIT PREPARED comes after it is left prepared on the target."""
    pair.pub.execute(f"ALTER DATABASE \"{pair.pub_db}\" SET logical_decoding_work_mem = '64kB'")
    cfg = _setup(pair, two_phase=True, memory_limit="64kB", spool_dir=str(pair.workdir / "sp"))
    big = "INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series({}, {}) g"
    pair.pub_exec(big.format(1000, 3999))  # streamed (larger than the decoding memory)
    pair.pub_exec("BEGIN; INSERT INTO t VALUES (2, 'p'); PREPARE TRANSACTION 'g1'")
    mid = pair.pub_exec("SELECT pg_current_wal_lsn()::text")[0][0]
    pair.pub_exec("COMMIT PREPARED 'g1'")
    pair.pub_exec(big.format(5000, 7999))
    _insert(pair, range(3, 4))

    rc, out, _ = _run(cfg, "--until-lsn", mid)
    assert rc == 0, out
    assert "stream_commit" in out or "streamed transaction commits" in out, out[-3000:]
    ids = _ids(pair)
    assert ids == list(range(1000, 4000)), (len(ids), ids[:3], ids[-3:])
    prepared = pair.sub_exec(
        "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"
    )[0][0]
    assert prepared == 1

    rc, out, _ = _run(cfg, "--until-caught-up")
    assert rc == 0, out
    assert _ids(pair) == [2, 3, *range(1000, 4000), *range(5000, 8000)]
    assert pair.sub_exec("SELECT count(*) FROM pg_prepared_xacts")[0][0] == 0
