"""``applier cutover``: the guided switch, once the user has stopped writes on the source.

Steps
=====

1. Read where things stand (:func:`applier.status.report.collect`): the source's
   current WAL position X (``pg_current_wal_lsn()``), the slot, the origin's
   progress, the worker's row; the lag at start, in bytes and seconds, as
   ``applier status`` shows it (:mod:`applier.lag`: 0 s when nothing is
   pending; seconds unknown, and said so, when no worker runs).
   A missing or lost slot ends it here (exit 3): applying in-process would
   create a fresh slot and report a catch-up that is none.
2. Get the target to X:

   * **A worker runs** (the slot is active, or the worker's heartbeat is
     fresh): wait until the slot's ``confirmed_flush_lsn`` reaches X. Not the
     origin's progress: X may lie past the last commit of our database (WAL
     of other databases, checkpoints), so the origin may never reach it;
     the worker confirms its received position when it has nothing in hand
     (:mod:`applier.apply.worker`), and only after applying everything before
     it. It confirms at its status interval, so this takes up to
     ``[apply] status_interval`` after the last transaction is applied. If
     the worker stops on an error meanwhile, the cutover ends (exit 3) naming
     it; if it stops cleanly, the cutover goes on in-process.
   * **No worker runs**: apply up to X in this process, as ``applier run
     --until-caught-up`` does (:mod:`applier.apply.handlers.until`), in a thread so
     that ``--timeout`` can stop it.

   Before either, the privileges both (and the sequences' copy) need are
   checked (:mod:`applier.privileges`): one refusal naming the GRANTs.
3. Copy the sequences' current values (``applier sync-sequences``):
   pgoutput does not replicate them; nor large objects: the target's are
   made the source's (created, changed, deleted: :func:`applier.largeobjects.sync`).
4. Report the target's prepared transactions of this origin left open (a
   PREPARE before X whose COMMIT PREPARED has not come: finish it on the
   source, then rerun).
5. ``--verify``: one round of :func:`applier.verify.compare`, with the strict
   check of sequences (step 3 synced them); the report names the tables that
   differ and how (rows, schema, sequences).
6. Print the report and what to do next (``--json``: the same as one object).

Exit codes as for ``verify``: 0 caught up (and equal with ``--verify``), 1
differences found, 2 usage or configuration, 3 could not complete (timeout,
the worker stopped on an error, a server refused), naming why.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import psycopg

from . import pgconn
from .config import Config
from .errors import EXIT_USAGE, ApplierError, ConfigError, PermanentError
from .lag import Lag
from .lsn import Lsn
from .status.health import HEALTHY

log = logging.getLogger("applier.cutover")

EXIT_EQUAL, EXIT_DIFFERENT, EXIT_INCOMPLETE = 0, 1, 3

#: Seconds between two looks at the slot while a running worker catches up.
POLL = 0.5


class CutoverFailed(PermanentError):
    """The target could not be brought to the source's position (exit 3)."""


@dataclass
class Report:
    position: str = ""
    mode: str = ""
    lag_bytes_at_start: int | None = None
    lag_seconds_at_start: float | None = None
    #: Why the seconds are not known (no worker running to measure them).
    lag_note_at_start: str | None = None
    caught_up: bool = False
    catch_up_seconds: float | None = None
    origin_progress: str | None = None
    confirmed: str | None = None
    sequences_set: int | None = None
    #: Large objects created, changed, deleted on the target (and bytes copied).
    large_objects: dict[str, int] | None = None
    prepared_left: list[str] = field(default_factory=list)
    verify: str = "not run"
    #: With --verify: the tables that differ, each with how (rows, schema).
    verify_differences: list[str] = field(default_factory=list)
    code: int = EXIT_INCOMPLETE
    error: str | None = None
    hint: str | None = None
    next_steps: list[str] = field(default_factory=list)


def run_cutover(
    cfg: Config,
    *,
    timeout: float,
    verify: bool = False,
    as_json: bool = False,
    out: TextIO = sys.stdout,
) -> int:
    """``applier cutover``: catch up, sync sequences, maybe verify, report; the exit code."""
    rep = Report()
    try:
        _cutover(cfg, rep, timeout, verify)
    except ApplierError as e:
        rep.code = EXIT_USAGE if isinstance(e, ConfigError) else EXIT_INCOMPLETE
        rep.error = str(e)
        rep.hint = e.hint
    rep.next_steps = _next_steps(cfg, rep)
    if as_json:
        json.dump(asdict(rep), out, indent=2, default=str)
        out.write("\n")
    else:
        _render(rep, out)
    return rep.code


def _cutover(cfg: Config, rep: Report, timeout: float, verify: bool) -> None:
    from applier.apply.handlers.until import current_wal_lsn

    from .status.report import collect

    deadline = time.monotonic() + timeout
    st = collect(cfg)
    if not (st.source_reachable and st.target_reachable):
        raise CutoverFailed(
            "; ".join(st.errors) or "a server is unreachable",
            hint="check [source]/[target] dsn and that both servers are up; rerun cutover",
        )
    if st.slot is None or st.slot.get("wal_status") == "lost":
        # Applying in-process would create a fresh slot and "catch up" with nothing.
        raise CutoverFailed(st.reason or "the slot is missing or lost", hint=st.hint)
    _check_privileges(cfg)
    position = current_wal_lsn(cfg)
    rep.position = str(position)
    rep.lag_bytes_at_start = st.lag_bytes
    rep.lag_seconds_at_start = st.lag_seconds
    rep.lag_note_at_start = st.lag_note
    started = time.monotonic()
    running = st.worker_holds_slot or st.code == HEALTHY
    if running:
        rep.mode = "waited for the running worker"
        running = _wait_for_worker(cfg, position, deadline)
    if not running:
        rep.mode = (
            "applied in-process (the worker stopped meanwhile)"
            if rep.mode
            else "applied in-process (no worker running)"
        )
        _apply_in_process(cfg, position, deadline)
    rep.caught_up = True
    rep.catch_up_seconds = round(time.monotonic() - started, 2)
    rep.origin_progress, rep.confirmed, rep.prepared_left = _positions(cfg)
    rep.sequences_set = _sync_sequences(cfg)
    rep.large_objects = _sync_large_objects(cfg)
    rep.code = EXIT_EQUAL
    if verify:
        rep.code = _verify(cfg, rep)


# -- catching up ----------------------------------------------------------------------


def _wait_for_worker(cfg: Config, position: Lsn, deadline: float) -> bool:
    """Wait until the slot's confirmed position reaches ``position``; False when the
    worker stopped cleanly (the caller applies in-process), raise when it failed."""
    from .status.report import collect

    log.info("waiting for the running worker", extra={"ctx": {"position": position}})
    while True:
        st = collect(cfg)
        confirmed = (st.slot or {}).get("confirmed_flush_lsn")
        if confirmed and Lsn.parse(confirmed) >= position:
            return True
        worker = st.worker or {}
        if worker.get("state") == "error" and not st.worker_holds_slot:
            raise CutoverFailed(
                f"the worker stopped on an error: {_worker_error(worker)}",
                hint=(st.hint or "fix the cause") + "; then rerun cutover",
            )
        if not st.worker_holds_slot and st.code != HEALTHY:
            return False  # stopped cleanly: apply the rest here
        if time.monotonic() >= deadline:
            raise CutoverFailed(
                f"timed out: the running worker confirmed {confirmed or 'nothing'}, "
                f"short of {position}",
                hint="see `applier status` (lag, errors); rerun cutover with a longer --timeout",
            )
        time.sleep(POLL)


def _worker_error(worker: dict[str, Any]) -> str:
    err = worker.get("last_error")
    if isinstance(err, dict):
        ctx = err.get("context") or {}
        what = f"{err.get('kind')}: {err.get('message')}"
        if ctx:
            what += " (" + ", ".join(f"{k}={v}" for k, v in ctx.items()) + ")"
        return what
    return str(err)


def _apply_in_process(cfg: Config, position: Lsn, deadline: float) -> None:
    """``run --until-lsn position`` in a thread of this process, bounded by ``deadline``."""
    from applier.apply.handlers.until import Until

    from .apply.worker import Worker

    worker = Worker(cfg)
    until = worker.until = Until(position)
    failure: list[BaseException] = []

    def body() -> None:
        try:
            worker.run()
        except BaseException as e:  # handed to the main thread
            failure.append(e)

    log.info("applying up to the source's position", extra={"ctx": {"position": position}})
    thread = threading.Thread(target=body, name="applier-cutover", daemon=True)
    restore = _stop_on_signals(worker)
    try:
        thread.start()
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            worker.stop()
            thread.join(5)
            if thread.is_alive() and worker.status is not None:
                # Blocked in the target (a lock): it dies with this process, rolled
                # back; its row must not look like a running worker to the next cutover.
                worker.status.stopped()
            raise CutoverFailed(
                f"timed out before the target reached {position}",
                hint="rerun cutover with a longer --timeout (it continues where it stopped); "
                "`applier status` shows the lag",
            )
    finally:
        restore()
    if failure:
        e = failure[0]
        if isinstance(e, ConfigError):
            raise e  # exit 2, as `applier run` would
        if isinstance(e, ApplierError):
            raise CutoverFailed(
                f"applying up to {position} failed: {e}",
                hint=(e.hint or "fix the cause") + "; then rerun cutover",
            ) from e
        raise CutoverFailed(f"applying up to {position} failed: {e!r}") from e
    if not until.done:
        raise CutoverFailed(f"interrupted before the target reached {position}")


def _stop_on_signals(worker: Any) -> Any:
    """SIGINT/SIGTERM stop the in-process worker cleanly; return the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, lambda *_: worker.stop())

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore


# -- after catching up ----------------------------------------------------------------


def _positions(cfg: Config) -> tuple[str | None, str | None, list[str]]:
    """The origin's progress, the slot's confirmed position, the prepared GIDs left."""
    from applier.apply.parallel.origins import restart_point
    from applier.apply.target.origin import prepared_gids

    try:
        with pgconn.connect(
            cfg.target.conninfo(), side="target", purpose="applier cutover", connect_timeout=30
        ) as tgt:
            progress = restart_point(tgt, cfg.origin)  # with the group's (parallel apply)
            gids = sorted(prepared_gids(tgt, f"applier_{cfg.origin}_"))
        with pgconn.connect(
            cfg.source.conninfo(), side="source", purpose="applier cutover", connect_timeout=30
        ) as src:
            row = src.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_catalog.pg_replication_slots "
                "WHERE slot_name = %s",
                (cfg.source.slot,),
            ).fetchone()
    except psycopg.Error as e:
        raise CutoverFailed(f"cannot read the positions: {str(e).strip()}") from None
    return (str(progress) if progress else None), (row[0] if row else None), gids


def _check_privileges(cfg: Config) -> None:
    """Before catching up: what applying and setting the sequences need, in one refusal."""
    from .bootstrap.plan import published_tables
    from .bootstrap.sequences import connect
    from .privileges import check, scope_of

    with (
        connect(cfg.source.conninfo(), "source") as src,
        connect(cfg.target.conninfo(), "target") as tgt,
    ):
        scope = scope_of(src, published_tables(src, cfg))
        check("cutover", scope, source=src, target=tgt)


def _sync_sequences(cfg: Config) -> int:
    from .bootstrap.plan import discover
    from .bootstrap.sequences import connect, read_values, sequences_of, set_values

    try:
        with (
            connect(cfg.source.conninfo(), "source") as src,
            connect(cfg.target.conninfo(), "target") as tgt,
        ):
            tables = discover(src, cfg).ddl_tables
            return set_values(tgt, read_values(src, sequences_of(src, tables)))
    except psycopg.Error as e:
        raise CutoverFailed(f"syncing the sequences failed: {str(e).strip()}") from None


def _sync_large_objects(cfg: Config) -> dict[str, int]:
    from .largeobjects import sync_databases

    try:
        return asdict(sync_databases(cfg.source.conninfo(), cfg.target.conninfo()))
    except psycopg.Error as e:
        raise CutoverFailed(f"syncing the large objects failed: {str(e).strip()}") from None


def _verify(cfg: Config, rep: Report) -> int:
    from .verify import compare  # its heavy parts (Spark) are imported when it runs

    try:
        # Strict: the sequences were synced just before, so one behind is a real difference.
        report = compare(cfg, rounds=1, strict_sequences=True)
    except ApplierError as e:
        rep.verify = f"could not complete: {e}"
        return EXIT_INCOMPLETE
    if report.equal:
        rep.verify = "equal"
        return EXIT_EQUAL
    rep.verify_differences = report.differing()
    rep.verify = (
        f"differences found in {', '.join(rep.verify_differences)} "
        "(`applier verify` shows the rows)"
    )
    return EXIT_DIFFERENT


# -- the report -----------------------------------------------------------------------


def _next_steps(cfg: Config, rep: Report) -> list[str]:
    if rep.code in (EXIT_INCOMPLETE, EXIT_USAGE):
        return [
            "do not switch yet: the target is not known to have everything",
            "keep writes on the source stopped (or resume them: nothing has changed there), "
            "fix what the error says and rerun `applier cutover`",
        ]
    steps = []
    if rep.code == EXIT_DIFFERENT:
        steps.append(
            "the target differs from the source: do not switch; see `applier verify` and fix "
            "(or re-bootstrap the tables), then rerun `applier cutover --verify`"
        )
    if rep.prepared_left:
        steps.append(
            f"{len(rep.prepared_left)} prepared transaction(s) are open on the target "
            "(COMMIT/ROLLBACK PREPARED not yet done on the source): finish them on the "
            "source, then rerun cutover"
        )
    if rep.code == EXIT_EQUAL:
        steps += [
            f"point the application at the target ({cfg.target.redacted}): connection "
            "strings, poolers, DNS; keep writes on the source stopped",
            "then stop `applier run` (nothing more will come) and, once you will not roll "
            "back, drop the slot: `applier drop --slot --yes` (it keeps WAL on the source)",
            "to roll back: point the application at the source again; it has every "
            "transaction up to the switch, but not what the application wrote to the target "
            "after it (keeping that needs a replication from the target back to the source, "
            "set up before the application writes there)",
        ]
    return steps


def _render(rep: Report, out: TextIO) -> None:
    verdict = {
        0: "caught up",
        1: "caught up, but the target differs",
        2: "NOT caught up (configuration)",
        3: "NOT caught up",
    }
    rows: list[tuple[str, str]] = [
        ("result", verdict.get(rep.code, str(rep.code))),
        ("source position", rep.position or "-"),
        ("how", rep.mode or "-"),
        (
            "lag at start",
            Lag(rep.lag_bytes_at_start, rep.lag_seconds_at_start, rep.lag_note_at_start).describe(),
        ),
        ("time to catch up", _secs(rep.catch_up_seconds)),
        ("origin progress", rep.origin_progress or "-"),
        ("slot confirmed", rep.confirmed or "-"),
        ("sequences set", "-" if rep.sequences_set is None else str(rep.sequences_set)),
        ("large objects", _large_objects(rep.large_objects)),
        ("verify", rep.verify),
    ]
    if rep.prepared_left:
        rows.append(("prepared left open", ", ".join(rep.prepared_left)))
    if rep.error:
        rows.append(("error", rep.error))
    if rep.hint:
        rows.append(("hint", rep.hint))
    width = max(len(k) for k, _ in rows)
    out.write("applier cutover\n")
    for k, v in rows:
        out.write(f"  {k:<{width}}  {v}\n")
    out.write("next:\n")
    for step in rep.next_steps:
        out.write(f"  - {step}\n")


def _large_objects(counts: dict[str, int] | None) -> str:
    if counts is None:
        return "-"
    return ", ".join(f"{counts[k]} {k}" for k in ("created", "changed", "deleted"))


def _secs(s: float | None) -> str:
    return "-" if s is None else f"{s:.1f} s"
