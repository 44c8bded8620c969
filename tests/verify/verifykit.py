"""What the verify tests that drive the job's parts directly share."""

from __future__ import annotations

from typing import Any

from applier.verify.hashing import Catchup

#: No catch-up wait: the tests' sides are still.
NO_WAIT = Catchup("none", "none", False, 0.0)


class NoSpark:
    """A Spark that never comes up: every range runs on the driver's threads."""

    def start(self) -> None:
        pass

    def ready(self) -> bool:
        return False

    def context(self) -> Any:
        raise AssertionError("the driver was to run every range")
