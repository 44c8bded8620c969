"""What the path decision and the lanes read of the engine: :class:`PathsHost`, :class:`LaneHost`.

The lanes (:mod:`.copylane`, :mod:`.insertlane`, :mod:`.mergelane`) and the one
decision of which path a change takes (:mod:`.paths`) are handed the
:class:`~applier.apply.handlers.dispatch.Applier`; these Protocols name exactly what
they read of it and the one service they call (sending held rows), so mypy checks
every use and a new dependency shows up here first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from applier.apply.batching.merge import UpdateMerger
    from applier.apply.batching.paths import Paths
    from applier.apply.core.states import Txn
    from applier.apply.core.tally import Tally
    from applier.apply.rules.skiprules import SkipRules
    from applier.apply.rules.tablesync import TableSyncs
    from applier.apply.sql.mapping import RelMap
    from applier.apply.sql.planner import Planner
    from applier.apply.target.session import TargetSession


class PathsHost(Protocol):
    """The inputs of the path decision (:func:`~applier.apply.batching.paths.decide`)."""

    #: The decided paths per mapping version, and the inputs they were decided on.
    paths_stamp: tuple[Any, ...]

    @property
    def paths(self) -> dict[int, Paths]: ...
    @property
    def careful(self) -> bool: ...
    @property
    def merging(self) -> bool: ...
    @property
    def rules(self) -> SkipRules: ...
    @property
    def syncs(self) -> TableSyncs: ...
    @property
    def session(self) -> TargetSession: ...


class LaneHost(PathsHost, Protocol):
    """What a lane reads and counts past the handlers."""

    txn: Txn | None
    #: Rows that went through a lane.
    lane_rows: int

    @property
    def relmaps(self) -> dict[int, RelMap]: ...
    @property
    def merger(self) -> UpdateMerger: ...
    @property
    def planner(self) -> Planner: ...
    @property
    def tally(self) -> Tally: ...

    def send_held(self, oid: int | None = None) -> None:
        """Send the merged rows held for one table (``oid``) or for all."""
