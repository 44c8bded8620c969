"""Build applier.speedups._speedups (a C extension) with the wheel; never fail for it.

hatchling runs :class:`SpeedupsHook` for every wheel build: a regular wheel
gets the compiled module (and a platform tag), an editable install (``pip
install -e .``, as ``scripts/setup`` runs it) gets it next to its sources in
``applier/speedups/``, where the editable path finds it. The compiler and flags
are the ones this Python was built with (sysconfig), the way setuptools picks
them, without needing setuptools. When there is no compiler, or it fails, the
build says so on stderr and goes on: applier then runs its pure-Python twins
(chosen once, in applier/speedups/__init__.py).

The module is one extension built from several C files (:data:`SOURCES`,
which share ``speedups.h``), all compiled and linked in one compiler run.

``python hatch_build.py`` builds the module in place, e.g. after editing the
C sources in a development tree (``scripts/setup`` does it when a source is
newer than the module).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "applier" / "speedups"
#: Every C file of the one module: module.c defines it, the others hold its
#: functions, each named after its Python twin (see the list in module.c).
SOURCES = [
    PACKAGE / name
    for name in (
        "module.c",
        "tuples.c",
        "decoder.c",
        "copyrun.c",
        "takeloop.c",
        "readahead.c",
        "mergelane.c",
        "dispatch.c",
    )
]
MODULE = "applier/speedups/_speedups"


def module_filename() -> str:
    """The file name for this interpreter, e.g. ``_speedups.cpython-311-x86_64-linux-gnu.so``."""
    return "_speedups" + str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def compile_module(out_dir: Path) -> Path | None:
    """Compile the module into ``out_dir``; its path, or None (with a warning) if that failed."""
    ldshared = sysconfig.get_config_var("LDSHARED")
    if not ldshared:
        _warn("this Python names no C compiler (sysconfig LDSHARED)")
        return None
    flags = [
        *shlex.split(sysconfig.get_config_var("CFLAGS") or ""),
        *shlex.split(sysconfig.get_config_var("CCSHARED") or ""),
        "-I" + sysconfig.get_paths()["include"],
    ]
    target = out_dir / module_filename()
    out_dir.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed over it: a process that has the old
    # module loaded keeps its (unlinked) copy instead of seeing it change.
    fd, tmp = tempfile.mkstemp(prefix=".speedups-", suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [*shlex.split(ldshared), *flags, *map(str, SOURCES), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        os.unlink(tmp)
        _warn(f"could not run the C compiler: {exc}")
        return None
    if proc.returncode != 0:
        os.unlink(tmp)
        _warn(f"the C compiler failed ({shlex.join(cmd)}):\n{proc.stderr.strip()}")
        return None
    os.replace(tmp, target)
    return target


def _warn(what: str) -> None:
    print(
        f"applier: not building the C speedups, applier will run pure Python: {what}",
        file=sys.stderr,
    )


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run as a script, without hatchling
    pass
else:

    class SpeedupsHook(BuildHookInterface):  # type: ignore[misc]
        """Compile the C module into the wheel (or in place for an editable install)."""

        PLUGIN_NAME = "custom"

        def initialize(self, version: str, build_data: dict[str, Any]) -> None:
            if version == "editable":
                compile_module(PACKAGE)
                return
            built = compile_module(Path(self.directory) / "speedups-build")
            if built is None:
                return
            build_data["force_include"][str(built)] = f"{MODULE}{built.name[len('_speedups') :]}"
            # A compiled module makes the wheel specific to this interpreter and platform.
            build_data["pure_python"] = False
            build_data["infer_tag"] = True


if __name__ == "__main__":
    sys.exit(0 if compile_module(PACKAGE) else 1)
