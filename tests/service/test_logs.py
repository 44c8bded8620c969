"""Logs: the fatal error through logging, ISO 8601 timestamps, journald priority prefixes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from apply.applykit import Runner
from conftest import Pair

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")


def _fail_on_a_duplicate_key(pair: Pair, **sections: dict[str, object]) -> Runner:
    """A worker that stops on an apply error (exit 3) naming lsn, xid, table, key."""
    pair.both("CREATE TABLE t (id int PRIMARY KEY)")
    pair.sub_exec("INSERT INTO t VALUES (2)")
    pair.pub_exec("CREATE PUBLICATION pub FOR ALL TABLES")
    runner = Runner(pair, pair.write_config(**sections)).start().ready()
    pair.pub_exec("INSERT INTO t VALUES (2)")
    assert runner.wait(60) == 3, runner.log()[-3000:]
    return runner


# The log's format, not the server's: the duplicate key is 23505 on every target.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_fatal_error_is_one_json_line_with_the_error_fields(pair: Pair) -> None:
    runner = _fail_on_a_duplicate_key(pair, logging={"format": "json", "level": "debug"})
    lines = runner.log().splitlines()
    records = [json.loads(ln) for ln in lines]  # every line is one JSON object
    for rec in records:
        assert ISO.match(rec["ts"]), rec
        assert datetime.fromisoformat(rec["ts"]).utcoffset() is not None
    fatal = [r for r in records if r.get("exit_code") is not None]
    assert len(fatal) == 1, fatal  # once, not again as plain text
    err = fatal[0]
    assert err == records[-1]
    assert err["level"] == "error" and err["logger"] == "applier"
    assert err["exit_code"] == 3 and err["error"] == "ApplyError"
    assert err["table"] == "public.t" and err["sqlstate"] == "23505"
    assert re.match(r"^[0-9A-F]+/[0-9A-F]+$", err["lsn"]) and isinstance(err["xid"], int)
    assert err["hint"] and "hint:" not in err["msg"] and "lsn=" not in err["msg"]
    assert not [ln for ln in lines if "applier: error" in ln or "Traceback" in ln]


# The log's format, not the server's: the duplicate key is 23505 on every target.
@pytest.mark.parametrize("pair", ["15-18"], indirect=True)
def test_journald_prefixes_each_line_with_its_priority(pair: Pair) -> None:
    runner = _fail_on_a_duplicate_key(pair, logging={"journald": True, "level": "debug"})
    lines = runner.log().splitlines()
    prio = {"DEBUG": "7", "INFO": "6", "WARNING": "4", "ERROR": "3"}
    seen = set()
    current = None
    for ln in lines:
        assert re.match(r"^<[3467]>", ln), ln  # continuation lines too
        m = re.match(r"^<(\d)>(\S+) (DEBUG|INFO|WARNING|ERROR) ", ln)
        if not m:  # a continuation line of a multi-line record: the record's priority
            assert ln.startswith(f"<{current}>"), ln
            continue
        current = m.group(1)
        assert m.group(1) == prio[m.group(3)], ln
        assert ISO.match(m.group(2)), ln
        seen.add(m.group(3))
    assert {"DEBUG", "INFO", "ERROR"} <= seen
    assert re.match(r"^<3>\S+ ERROR +applier: error: .*lsn=.*hint: ", lines[-1]), lines[-1]


def test_an_error_before_logging_is_set_up_has_the_same_form(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "applier.cli", "status", "--config", str(tmp_path / "none.toml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    ts, level, rest = line.split(" ", 2)
    assert ISO.match(ts) and level == "ERROR", line
    assert rest.lstrip().startswith("applier: error: ") and "no such file" in rest, line
