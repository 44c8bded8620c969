"""Parallel apply (issue 36), faults: every row change applied exactly once.

Four writers on the source commit a few hundred small transactions on keys of
their own, a quarter of them also updating one of a few hot rows (transactions
that must wait for each other on the target). The target is slow on purpose: an
ENABLE ALWAYS trigger on ``t`` (declared in ``trusted_triggers``, so ``t`` is not
a barrier) logs each row change and sleeps 10 ms, so a backlog builds and each
fault meets transactions in flight in the pool (``applier_apply_in_flight_transactions``
is waited for before it). After applier is SIGKILLed, the target is stopped
with ``-m immediate``, or a pool session's backend is terminated, the tables
equal the source's and the target's change log holds each source change once
(:func:`parkit.assert_each_change_once`).

A restart after the sessions' origins advanced unequally (``<origin>.1 ..
<origin>.4`` hold different LSNs when applier is killed), with ``workers`` 4,
then 1, then 2: the restart point is the largest progress among the origins.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from applykit import Runner, wait_equal
from conftest import Pair
from parkit import (
    apply_section,
    assert_each_change_once,
    changes_on,
    in_flight,
    insert_hot_rows,
    keyed_schema,
    member_progress,
    pool_backends,
    run_keyed_writers,
    sessions_that_applied,
    wait_until,
)

from applier.localpg import free_port

#: Seconds the target's trigger sleeps a row change of ``t``.
SLOW = "0.01"


def _runner(pair: Pair, port: int, workers: int = 4, log_name: str = "applier.log") -> Runner:
    cfg = pair.write_config(
        apply=apply_section(workers, trusted_triggers=["public.t"]),
        metrics={"listen": f"127.0.0.1:{port}"},
    )
    return Runner(pair, cfg, log_name)


def _mid_flight(
    pair: Pair, runner: Runner, port: int | None, done: int, total: int, share: float
) -> None:
    """Wait until ``share`` of the changes after the first ``done`` of ``total`` are on
    the target and (``port`` given: a pool's metrics) several transactions are in flight."""
    goal = done + share * (total - done)

    def there() -> bool:
        return changes_on(pair.sub_exec) >= goal and (port is None or in_flight(port) >= 2)

    wait_until(there, runner, 120, f"{goal:.0f} of {total} changes applied, more in flight")


@pytest.mark.slow
def test_kills_and_a_terminated_session_apply_each_change_once(pair: Pair) -> None:
    """SIGKILL three times, then one pool session's backend terminated, each with
    transactions in flight: equal tables, each change once."""
    keyed_schema(pair, SLOW)
    port = free_port()
    runner = _runner(pair, port).start().ready()
    insert_hot_rows(pair)
    run_keyed_writers(pair, seed=1)
    total = changes_on(pair.pub_exec)
    for n, share in enumerate((0.15, 0.35, 0.55), start=2):
        _mid_flight(pair, runner, port, 0, total, share)
        runner.kill()
        runner = Runner(pair, runner.config, f"applier-{n}.log").start()

    _mid_flight(pair, runner, port, 0, total, 0.7)
    wait_until(lambda: "applier apply 2" in pool_backends(pair), runner, 30, "session 2")
    victim = pool_backends(pair)["applier apply 2"]
    pair.sub.execute(f"SELECT pg_catalog.pg_terminate_backend({victim})")

    wait_equal(pair, ["t", "u"], timeout=120, runner=runner)
    assert_each_change_once(pair)
    assert sessions_that_applied(pair) > 1
    assert runner.stop() == 0


@pytest.mark.slow
def test_target_immediate_stop_applies_each_change_once(make_pair: Callable[..., Pair]) -> None:
    """The target stopped with ``-m immediate`` twice while the pool applies: its
    open transactions are lost, the origins recovered from the WAL; applier retries."""
    pair = make_pair(15, 18)
    keyed_schema(pair, SLOW)
    port = free_port()
    runner = _runner(pair, port).start().ready()
    insert_hot_rows(pair)
    run_keyed_writers(pair, seed=2)
    total = changes_on(pair.pub_exec)
    for share in (0.2, 0.5):
        _mid_flight(pair, runner, port, 0, total, share)
        pair.sub.stop("immediate")
        pair.sub.start()
    wait_equal(pair, ["t", "u"], timeout=150, runner=runner)
    assert_each_change_once(pair)
    assert sessions_that_applied(pair) > 1
    assert runner.stop() == 0


def _differing_members(pair: Pair) -> dict[str, str]:
    """The group's members that made progress; at least two, at different LSNs."""
    members = {k: v for k, v in member_progress(pair, pair.slot).items() if v != "0/0"}
    assert len(set(members.values())) >= 2, f"the sessions' origins did not differ: {members}"
    return members


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["18-18"], indirect=True)  # 15 targets: the kill tests
def test_restart_after_unequal_origins_with_4_then_1_then_2_sessions(pair: Pair) -> None:
    """Killed twice with 4 sessions mid-flight (the members' LSNs differ each time),
    killed with 1 session (the plain origin moves past the group), ended with 2
    (members 3 and 4, left from the larger group, are dropped): each change once."""
    keyed_schema(pair, SLOW)
    port = free_port()
    runner = _runner(pair, port).start().ready()
    insert_hot_rows(pair)
    for phase, (workers, seed) in enumerate(((4, 11), (4, 12), (1, 13), (2, 14)), start=1):
        if phase > 1:
            runner = _runner(pair, port, workers, f"applier-{phase}.log").start().ready()
        done = changes_on(pair.sub_exec)
        run_keyed_writers(pair, seed, txns=30)
        if workers == 2:
            break  # the last phase runs to the end
        _mid_flight(
            pair, runner, port if workers > 1 else None, done, changes_on(pair.pub_exec), 0.3
        )
        runner.kill()
        if workers > 1:
            _differing_members(pair)
    wait_equal(pair, ["t", "u"], timeout=150, runner=runner)
    assert_each_change_once(pair)
    # Members 3 and 4 were below the restart point (the plain origin moved past the
    # group with one session): the run with 2 dropped them, and nothing was lost.
    assert set(member_progress(pair, pair.slot)) == {f"{pair.slot}.{n}" for n in (1, 2)}
    assert runner.stop() == 0
