"""The large objects' copy under an exported snapshot (bootstrap) and their sync (cutover),
on real servers, through the modules themselves (no Spark: the copy runs in the driver)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import ONE_PAIR, Pair

from applier import largeobjects as lo
from applier import pgconn
from applier.bootstrap import largeobjects as boot
from applier.errors import BootstrapError, BootstrapRefused
from largeobjects.lokit import STATE, load, roles, state


def _sessions(pair: Pair) -> tuple[Any, Any]:
    src = pgconn.connect(pair.pub_dsn, side="source", purpose="test")
    tgt = pgconn.connect(pair.sub_dsn, side="target", purpose="test")
    return src, tgt


# 18 -> 18 too: the source side's catalog reads and ACLs on the newest server.
@pytest.mark.parametrize("pair", ["15-15", "15-18", "18-18"], indirect=True)
def test_copy_under_the_snapshot_then_sync_then_rerun(pair: Pair) -> None:
    with roles(pair) as r:
        load(pair, r)
        cfg = pair.config()
        holder = pair.pub_conn()
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        snapshot = holder.execute("SELECT pg_export_snapshot()").fetchone()[0]  # type: ignore[index]
        at_snapshot = state(pair, "pub")
        # After the snapshot: one created, one deleted, one rewritten.
        pair.pub_exec(
            "SELECT lo_from_bytea(10005, 'later'::bytea); SELECT lo_unlink(10001);"
            "SELECT lo_put(10002, 5, 'changed'::bytea)"
        )
        src, tgt = _sessions(pair)
        with src, tgt:
            boot.check(cfg, src, tgt)
            done = boot.copy(cfg, src, tgt, snapshot)
            assert (done.objects, done.bytes) == (4, 100 + 600_000 + 2_560_000)
            assert state(pair, "sub") == at_snapshot  # owners, ACLs, data (md5 on each server)
            # A rerun under the same snapshot copies nothing and doubles nothing.
            again = boot.copy(cfg, src, tgt, snapshot)
            assert again.objects == 0 and state(pair, "sub") == at_snapshot
            holder.close()
            # Cutover, writes stopped: created, changed and deleted since the snapshot.
            tgt2 = pgconn.connect(pair.sub_dsn, side="target", purpose="test")
            with tgt2:
                src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                counts = lo.sync(src, tgt, tgt2)
                src.execute("ROLLBACK")
                assert (counts.created, counts.changed, counts.deleted) == (1, 1, 1)
                assert state(pair, "sub") == state(pair, "pub")
                assert [x[0] for x in state(pair, "sub")] == [10002, 10003, 10004, 10005]
                # Nothing left to do: a second sync changes nothing.
                src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                counts = lo.sync(src, tgt, tgt2)
                src.execute("ROLLBACK")
                assert (counts.created, counts.changed, counts.deleted) == (0, 0, 0)


@ONE_PAIR
def test_a_role_the_target_lacks_is_refused_before_anything_is_copied(pair: Pair) -> None:
    with roles(pair, 1, target=False) as r:
        pair.pub_exec(
            f"SELECT lo_from_bytea(20001, 'x'::bytea); ALTER LARGE OBJECT 20001 OWNER TO {r[0]}"
        )
        src, tgt = _sessions(pair)
        with src, tgt, pytest.raises(BootstrapRefused) as e:
            boot.check(pair.config(), src, tgt)
        assert r[0] in e.value.message and "CREATE ROLE" in str(e.value.hint)
        assert e.value.exit_code == 3
        assert pair.sub_exec(STATE) == []


@ONE_PAIR
def test_an_object_the_target_has_with_other_data_is_named(pair: Pair) -> None:
    pair.pub_exec("SELECT lo_from_bytea(30001, 'source'::bytea)")
    pair.sub_exec("SELECT lo_from_bytea(30001, 'target'::bytea)")
    src, tgt = _sessions(pair)
    with src, tgt, pytest.raises(BootstrapRefused) as e:
        boot.check(pair.config(), src, tgt)
    assert "30001" in e.value.message and "lo_unlink" in str(e.value.hint)


@ONE_PAIR
def test_truncate_replaces_an_object_the_target_has_with_other_data(pair: Pair) -> None:
    pair.pub_exec("SELECT lo_from_bytea(30001, 'source'::bytea)")
    pair.sub_exec("SELECT lo_from_bytea(30001, 'target'::bytea)")
    cfg = pair.config()
    holder = pair.pub_conn()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    snapshot = holder.execute("SELECT pg_export_snapshot()").fetchone()[0]  # type: ignore[index]
    src, tgt = _sessions(pair)
    with src, tgt, holder:
        boot.check(cfg, src, tgt, replace=True)
        with pytest.raises(BootstrapRefused, match="30001"):
            boot.copy(cfg, src, tgt, snapshot)  # without --truncate: refused under it too
        assert boot.copy(cfg, src, tgt, snapshot, replace=True).objects == 1
    assert state(pair, "sub") == state(pair, "pub")


@ONE_PAIR
def test_not_copied_when_configured_so_and_said_once(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    pair.pub_exec("SELECT lo_from_bytea(40001, 'x'::bytea)")
    cfg = pair.config(bootstrap={"large_objects": False})
    src, tgt = _sessions(pair)
    with src, tgt:
        boot.check(cfg, src, tgt)
        assert boot.copy(cfg, src, tgt, "unused").objects == 0
    said = [r.getMessage() for r in caplog.records if "large object" in r.getMessage()]
    assert len(said) == 1 and "1 large object(s)" in said[0] and "cutover" in said[0], said
    assert pair.sub_exec(STATE) == []


def test_a_copy_failing_half_way_leaves_whole_batches_and_a_rerun_completes(pair: Pair) -> None:
    """The target role may give objects to r0 but not (yet) to r1: the second batch fails
    at its first r1 object. The first batch stays whole, the second leaves nothing; with
    the membership granted, a rerun copies the rest and doubles nothing."""
    from bootstrap.test_privileges import add_role

    with roles(pair, 2) as r:
        first, rest = range(70001, 70001 + lo.BATCH), range(70001 + lo.BATCH, 70005 + lo.BATCH)
        pair.pub_exec(
            "".join(
                f"SELECT lo_from_bytea({o}, 'x{o}'::bytea); ALTER LARGE OBJECT {o} OWNER TO {r[0]};"
                for o in first
            )
            + "".join(
                f"SELECT lo_from_bytea({o}, 'y{o}'::bytea); ALTER LARGE OBJECT {o} OWNER TO {r[1]};"
                for o in rest
            )
        )
        tgt_role = add_role(pair, "sub", f"CREATE ROLE {{r}} LOGIN; GRANT {r[0]} TO {{r}}")
        cfg = pair.config()
        tgt_dsn = pair.sub.dsn(pair.sub_db, user=tgt_role)
        holder = pair.pub_conn()
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        snapshot = holder.execute("SELECT pg_export_snapshot()").fetchone()[0]  # type: ignore[index]
        with holder, pgconn.connect(pair.pub_dsn, side="source", purpose="test") as src:
            with (
                pgconn.connect(tgt_dsn, side="target", purpose="test") as tgt,
                pytest.raises(
                    BootstrapError, match=r"large objects 70017\.\.70020 failed: must be"
                ),
            ):
                boot.copy(cfg, src, tgt, snapshot)
            assert [x[0] for x in state(pair, "sub")] == list(first)
            pair.sub_exec(f"GRANT {r[1]} TO {tgt_role}")
            with pgconn.connect(tgt_dsn, side="target", purpose="test") as tgt:
                assert boot.copy(cfg, src, tgt, snapshot).objects == len(rest)
        assert state(pair, "sub") == state(pair, "pub")
