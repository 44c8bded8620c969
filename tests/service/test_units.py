"""The shipped systemd units: notify, watchdog, reload; the template keeps instances apart."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONF = Path(__file__).resolve().parents[2] / "conf"


def _keys(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            out.setdefault(k.strip(), []).append(v.strip())
    return out


@pytest.mark.parametrize("name", ["applier.service", "applier@.service"])
def test_units_are_notify_with_watchdog_and_reload(name: str, tmp_path: Path) -> None:
    text = (CONF / name).read_text()
    keys = _keys(text)
    assert keys["Type"] == ["notify"] and keys["NotifyAccess"] == ["main"]
    assert keys["WatchdogSec"] == ["60"]
    assert keys["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert keys["RestartPreventExitStatus"] == ["2 3"]
    if name.startswith("applier@"):
        assert keys["ExecStart"][0].endswith("--config /etc/applier/%i.toml")
        assert keys["StateDirectory"] == ["applier/%i"]  # a spool per instance
    if shutil.which("systemd-analyze") is None:
        return
    # What systemd itself says of the file (with an ExecStart that exists here).
    unit = tmp_path / name.replace("@.", "@x.")
    unit.write_text(text.replace("/opt/applier/venv/bin/applier", sys.executable))
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    complaints = [ln for ln in proc.stderr.splitlines() if unit.name in ln or "Unknown" in ln]
    assert not complaints, proc.stderr
