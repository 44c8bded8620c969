"""``python -m applier.cli ...``: the same as the ``applier`` command."""

from . import main

main()
