"""The rich console of the commands' human-readable output (status, verify).

A terminal gets rich's usual handling: its own width, colours. Piped output
(a file, ``less``, a ticket, ``watch``) has no width, and rich would assume 80
columns: a verify table showed ``public.measur…`` for a long table name, and
status broke an error over several lines. Piped, lines are as long as their
contents need instead, and nothing is cut.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console

#: The width of piped output: beyond any line applier prints, so nothing is
#: wrapped or cut. Tables stay as wide as their contents (rich only pads a
#: table to the console's width when asked to expand it).
PIPED_WIDTH = 10_000


def console(file: TextIO | None = None, *, stderr: bool = False) -> Console:
    """A console writing to ``file`` (default stdout, or stderr): terminal or piped."""
    from rich.console import Console

    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    width = None if _is_terminal(stream) else PIPED_WIDTH
    return Console(file=file, stderr=stderr, width=width)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False
