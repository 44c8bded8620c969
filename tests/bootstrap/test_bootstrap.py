"""Bootstrap end to end on real servers with a real local Spark."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from conftest import ONE_PAIR, SMOKE_PAIRS, Pair

from applier.bootstrap.job import run_bootstrap
from bootstrap.helpers import assert_same, load

pytestmark = pytest.mark.spark


def _slot_lsn(pair: Pair) -> str:
    q = "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{}'"
    return str(pair.pub_exec(q.format(pair.slot))[0][0])


@pytest.mark.parametrize("pair", SMOKE_PAIRS, indirect=True)
def test_bootstrap_copies_everything(pair: Pair, spark: Any) -> None:
    load(pair)
    cfg = pair.config(bootstrap={"slice_size": "64kB"})
    assert run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True) == 0

    assert_same(pair)
    # The big table was really cut into many slices.
    n = pair.sub_exec("SELECT count(*) FROM applier.bootstrap_slice WHERE src_name = 'big'")[0][0]
    assert n > 10
    # Post-data: PK and indexes, partition tree, replica identity.
    idx = {
        r[0] for r in pair.sub_exec("SELECT indexname FROM pg_indexes WHERE schemaname='public'")
    }
    assert {"big_pkey", "big_n", "parted_pkey", "types_pkey"} <= idx
    assert pair.sub_exec("SELECT relreplident FROM pg_class WHERE relname = 'nopk'") == [("f",)]
    # Sequences equal.
    for seq in ("big_id_seq", "types_id_seq"):
        q = f"SELECT last_value, is_called FROM {seq}"
        assert pair.pub_exec(q) == pair.sub_exec(q)
    # Origin at the slot's consistent point.
    progress = pair.sub_exec(
        f"SELECT remote_lsn::text FROM pg_replication_origin_status s "
        f"JOIN pg_replication_origin o ON o.roident = s.local_id WHERE roname = '{pair.slot}'"
    )
    assert progress == [(_slot_lsn(pair),)]
    assert pair.sub_exec("SELECT phase FROM applier.bootstrap_run") == [("done",)]
    # Autovacuum was off during the copy; every created table has the
    # source's storage options back, its TOAST table's too.
    options = (
        "SELECT c.relname, c.reloptions, t.reloptions FROM pg_class c "
        "LEFT JOIN pg_class t ON t.oid = c.reltoastrelid "
        "WHERE c.relname IN ('big', 'parted_eu', 'parted_us', 'types', 'nopk') ORDER BY 1"
    )
    assert pair.sub_exec(options) == pair.pub_exec(options)
    assert [r[1] for r in pair.sub_exec(options) if r[0] == "nopk"] == [["autovacuum_enabled=off"]]


@ONE_PAIR
def test_parallelism_caps_the_copies_at_once(pair: Pair, spark: Any) -> None:
    pair.pub_exec(
        "CREATE TABLE t (id int PRIMARY KEY, pad text);"
        "INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g;"
        "CREATE PUBLICATION pub FOR TABLE t;"
    )
    # Spark runs two tasks at once (local[2]); the config allows one copy.
    cfg = pair.config(bootstrap={"slice_size": "256kB", "parallelism": 1})
    assert run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True) == 0
    assert_same(pair, ["t"])
    spans = pair.sub_exec(
        "SELECT extract(epoch FROM done_at) - seconds, extract(epoch FROM done_at) "
        "FROM applier.bootstrap_slice ORDER BY 1"
    )
    assert len(spans) > 4
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, spans  # no two slices copied at the same time


@ONE_PAIR
def test_existing_slot_refused_then_recreated(pair: Pair, spark: Any) -> None:
    from applier.errors import BootstrapError

    pair.pub_exec(
        "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2);"
        "CREATE PUBLICATION pub FOR TABLE t;"
    )
    pair.pub_exec(f"SELECT pg_create_logical_replication_slot('{pair.slot}', 'pgoutput')")
    cfg = pair.config()
    with pytest.raises(BootstrapError, match="--recreate-slot"):
        run_bootstrap(cfg, recreate_slot=False, truncate=False, quiet=True)
    assert run_bootstrap(cfg, recreate_slot=True, truncate=False, quiet=True) == 0
    assert pair.sub_exec("SELECT id FROM t ORDER BY 1") == [(1,), (2,)]
