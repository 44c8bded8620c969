"""Binary COPY and user-defined types whose OIDs differ between the clusters (issue 12,
item 9): composites go as text, arrays of enums and domains stay binary."""

from __future__ import annotations

from typing import Any

from conftest import Pair
from usertypes import ARR_ROWS, COMP_ROWS, SOURCE, TABLES, TARGET

from applier.bootstrap.job import run_bootstrap
from bootstrap.helpers import assert_same


def test_bootstrap_user_types_other_oids(pair: Pair, spark: Any) -> None:
    pair.pub_exec(SOURCE + TABLES + ARR_ROWS + ";" + COMP_ROWS)
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    pair.sub_exec(TARGET + TABLES)
    assert run_bootstrap(pair.config(), recreate_slot=False, truncate=False, quiet=True) == 0
    assert_same(pair, ["arr", "comp"])
