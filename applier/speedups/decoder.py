"""The decoder's row messages in Python: what stands in for decoder.c.

decoder.c decodes Begin, Commit, Insert, Update and Delete outside stream
blocks; their Python twins are the decoder's own functions
(``applier.protocol.decoder._begin`` ...), which it hands to
:func:`row_decoders`: with the C module that binds the message classes and
gives the C decoders; here it gives the twins back as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["row_decoders"]

#: The tags of the messages, in the order of ``twins``.
TAGS = "BCIUD"


def row_decoders(
    classes: Sequence[type], twins: Sequence[Callable[[bytes], Any]]
) -> dict[str, Callable[[bytes], Any]]:
    """The decoder of each of Begin, Commit, Insert, Update, Delete by tag: ``twins``.

    ``classes`` are (Begin, Commit, Insert, Update, Delete, TupleData, Lsn), what
    the C decoders build."""
    if len(classes) != 7 or len(twins) != len(TAGS):
        raise TypeError("row_decoders(classes: 7 types, twins: 5 functions)")
    return dict(zip(TAGS, twins, strict=True))
