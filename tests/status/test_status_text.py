"""``applier status`` as a person reads it, piped (as into `less`, a file or a ticket).

Piped output has no terminal width: nothing may be cut at 80 columns or
wrapped into pieces, the last error is a sentence and not a JSON blob, and
the slot's holder is said in words, not ``False (pid None)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Pair

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apply"))
from applykit import Runner, wait_for

#: Longer than rich's 80 columns with the other columns, within 63 bytes (NAMEDATALEN).
LONG = "measurements_per_station_and_hour_since_the_network_went_live"


def _text(cfg: Path) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "status", "--config", str(cfg)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout


def _cell(text: str, label: str) -> str:
    """The value of the status table's row ``label``."""
    found = [ln.strip(" │").split("│") for ln in text.splitlines()]
    values = [cells[-1].strip() for cells in found if cells[0].strip() == label]
    assert len(values) == 1, (label, text)
    return values[0]


@pytest.mark.parametrize("pair", ["15-18"], indirect=True)  # not version-specific
def test_piped_status_is_whole_and_in_words(pair: Pair) -> None:
    pair.both(f"CREATE TABLE {LONG} (id int PRIMARY KEY, v text)")
    pair.pub_exec(f"CREATE PUBLICATION pub FOR TABLE {LONG}")
    pair.pub_exec(f"INSERT INTO {LONG} VALUES (1, 'a'), (2, 'b')")  # before the slot
    cfg = pair.write_config()
    runner = Runner(pair, cfg).start().ready()
    # update_missing, skipped by default: a conflict of the long-named table.
    pair.pub_exec(f"UPDATE {LONG} SET v = 'x' WHERE id = 1")
    wait_for(lambda: pair.sub_exec("SELECT count(*) FROM applier.conflict_log")[0][0] == 1, 30)
    rc, text = _text(cfg)
    assert rc == 0, text
    q = f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{pair.slot}'"
    assert _cell(text, "slot active") == f"yes (pid {pair.pub_exec(q)[0][0]})", text
    assert f"public.{LONG}" in text, text  # the conflicts table, whole
    assert "…" not in text, text

    # Then a duplicate key stops it: the error is one readable line.
    pair.sub_exec(f"INSERT INTO {LONG} VALUES (3, 'target only')")
    pair.pub_exec(f"INSERT INTO {LONG} VALUES (3, 'from the source')")
    assert runner.wait(60) == 3
    rc, text = _text(cfg)
    assert rc == 3, text
    assert _cell(text, "slot active") == "no", text
    # The error whole on a line of its own (a table cell would widen every row).
    (error,) = [ln for ln in text.splitlines() if ln.startswith("last error: ")]
    assert "duplicate key" in error and f"table=public.{LONG}" in error, text
    assert '{"' not in text, text  # no JSON
    err = pair.sub_exec("SELECT last_error FROM applier.worker_status")[0][0]
    err = err if isinstance(err, dict) else json.loads(err)
    assert error.startswith(f"last error: {err['kind']}: "), error
    assert _cell(text, "last error").endswith("(below)"), text
    assert runner.stop() in (0, 3)
