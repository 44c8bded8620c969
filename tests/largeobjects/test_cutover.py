"""``applier cutover`` makes the target's large objects the source's; ``run`` says at its
start that the stream does not carry them."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import ONE_PAIR, Pair

from largeobjects.lokit import roles, state

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apply"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cutover"))
from applykit import Runner
from test_cutover import _cutover


@ONE_PAIR
def test_cutover_syncs_created_changed_and_deleted_objects(pair: Pair) -> None:
    with roles(pair, 1) as r:
        pair.both("CREATE TABLE t (id serial PRIMARY KEY, doc oid)")
        pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
        # As bootstrap left it: the same object on both sides.
        for side in (pair.pub_exec, pair.sub_exec):
            side("SELECT lo_from_bytea(50002, 'first'::bytea)")
        pair.sub_exec("SELECT lo_from_bytea(50003, 'deleted since'::bytea)")
        cfg = pair.write_config()
        runner = Runner(pair, cfg)
        runner.start().ready()
        # Writes while replicating: the rows arrive, the objects do not.
        pair.pub_exec(
            "INSERT INTO t (doc) SELECT lo_from_bytea(50001, 'new'::bytea);"
            f"ALTER LARGE OBJECT 50001 OWNER TO {r[0]};"
            "SELECT lo_put(50002, 0, 'FIRST'::bytea);"
        )
        assert runner.stop() == 0
        said = [ln for ln in runner.log().splitlines() if "large object(s)" in ln]
        assert len(said) == 1 and "cutover" in said[0], said
        rc, rep, err = _cutover(cfg)
        assert rc == 0, (rep, err[-3000:])
        assert rep["large_objects"] == {"created": 1, "changed": 1, "deleted": 1, "bytes": 8}
        assert state(pair, "sub") == state(pair, "pub")
        assert pair.sub_exec("SELECT doc::int8 FROM t") == [(50001,)]
        # Again: nothing left to do.
        rc, rep, err = _cutover(cfg)
        assert rc == 0 and rep["large_objects"]["created"] == 0, (rep, err[-3000:])
