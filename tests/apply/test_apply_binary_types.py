"""``[apply] binary`` with user-defined types whose OIDs differ between the clusters."""

from __future__ import annotations

from applykit import Runner, origin_lsn, wait_equal
from conftest import Pair
from usertypes import ARR_ROWS, COMP_ROWS, SOURCE, TABLES, TARGET


def test_binary_arrays_of_enums_apply_and_composites_are_refused(pair: Pair) -> None:
    pair.pub_exec(SOURCE + TABLES)
    pair.sub_exec(TARGET + TABLES)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config(apply={"binary": True})).start().ready()
    # Arrays of enums, domains over enums and arrays of them: accepted in binary.
    pair.pub_exec(ARR_ROWS)
    wait_equal(pair, ["arr"], runner=runner)
    before = origin_lsn(pair, pair.slot)
    # Composites: refused up front, with what to do, before any of their rows.
    pair.pub_exec(COMP_ROWS)
    assert runner.wait(60) == 3
    line = [ln for ln in runner.log().splitlines() if " applier: error: " in ln][-1]
    assert "public.comp" in line and "composite" in line and "binary = false" in line, line
    assert pair.sub_exec("SELECT count(*) FROM comp") == [(0,)]
    assert origin_lsn(pair, pair.slot) == before
    # As text, the composite with another member type on the target converts.
    runner = Runner(pair, pair.write_config(), "applier2.log").start().ready()
    wait_equal(pair, ["arr", "comp"], runner=runner)
    assert runner.stop() == 0
