"""sync-tables' drops of a table's slot and origin, which need no Spark."""

from __future__ import annotations

import threading

import pytest
from conftest import Pair


@pytest.mark.parametrize("pair", ["15-15"], indirect=True)
def test_the_origin_is_dropped_once_the_stopped_catch_ups_backend_lets_go(pair: Pair) -> None:
    """A stopped catch-up's apply backend holds the table's origin until it exits, a
    moment after its connection closed: under load the drop came first and failed
    with 55006 (a full suite run, three tests). The drop waits for it instead."""
    from applier.synctables.copy import drop_origin

    pair.sub_exec("SELECT pg_replication_origin_create('applier_sync_held')")
    holder = pair.sub_conn(autocommit=True)
    holder.execute("SELECT pg_replication_origin_session_setup('applier_sync_held')")
    timer = threading.Timer(0.5, holder.close)  # the backend exits half a second later
    timer.start()
    try:
        with pair.sub_conn(autocommit=True) as tgt:
            drop_origin(tgt, "applier_sync_held")
    finally:
        timer.join()
        holder.close()
    assert pair.sub_exec(
        "SELECT count(*) FROM pg_replication_origin WHERE roname = 'applier_sync_held'"
    ) == [(0,)]
