"""Medians over the rounds, the markdown tables, the JSON dump."""

from __future__ import annotations

import math
import statistics
from typing import Any

Round = dict[str, dict[str, Any]]  # consumer key -> figures, or {"timeout"/"skipped": why}

LABELS = {"rb": "floor (built-in's options)", "ra": "floor (applier's options)",
          "b": "built-in", "p": "pglogical", "a0": "applier (before)", "a": "applier"}  # fmt: skip


#: Figures that are counts (applier's /metrics), not seconds or MB.
COUNTS = ("transactions", "serialised by key", "serialised by barrier", "deadlocks", "retried")


def median_of(rounds: list[Round], key: str, fig: str) -> float | None:
    vals = [r[key][fig] for r in rounds if key in r and isinstance(r[key].get(fig), float)]
    vals = [v for v in vals if not math.isnan(v)]
    return statistics.median(vals) if vals else None


def status(rounds: list[Round], key: str) -> str | None:
    """'> 600 s' when a round timed out, 'n/a' when skipped, else None."""
    for r in rounds:
        f = r.get(key)
        if f is None:
            return "-"
        if "timeout" in f:
            return f"> {f['timeout']:g} s" if isinstance(f["timeout"], float) else "timeout"
        if "skipped" in f:
            return "n/a"
    return None


def cell(rounds: list[Round], key: str) -> str:
    if key == "p" and not any("p" in r for r in rounds):
        return "n/a"  # pglogical: PostgreSQL 15 only
    s = status(rounds, key)
    if s:
        return s
    t = median_of(rounds, key, "time")
    return "-" if t is None else f"{t:.2f} s"


def ratio(rounds: list[Round], a: str, b: str) -> str:
    if status(rounds, a) or status(rounds, b):
        return "-"
    ta, tb = median_of(rounds, a, "time"), median_of(rounds, b, "time")
    return "-" if not ta or not tb else f"{ta / tb:.2f}"


def builtin_header(version: int) -> str:
    return "built-in (default: streaming=parallel)" if version >= 18 else \
        "built-in (default: streaming=off)"  # fmt: skip


def drain_table(version: int, results: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        f"| workload | drain floor (built-in's / applier's options) | {builtin_header(version)} "
        "| pglogical | applier | applier/built-in | applier/pglogical | applier peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in results.values():
        rounds: list[Round] = res["rounds"]
        rss = median_of(rounds, "a", "rss applier process")
        lines.append(
            f"| {res['describe']} | {cell(rounds, 'rb')} / {cell(rounds, 'ra')} "
            f"| {cell(rounds, 'b')} | {cell(rounds, 'p')} | {cell(rounds, 'a')} "
            f"| {ratio(rounds, 'a', 'b')} | {ratio(rounds, 'a', 'p')} "
            f"| {'-' if rss is None else f'{rss:.0f} MB'} |"
        )
    return lines


def _drained(rounds: list[Round], key: str) -> list[float]:
    """Per round: the time after the walsender connected (the drain without start-up)."""
    out = []
    for r in rounds:
        f = r.get(key, {})
        if isinstance(f.get("time"), float) and isinstance(f.get("walsender up"), float):
            out.append(f["time"] - f["walsender up"])
    return out


def start_drain(rounds: list[Round], key: str) -> str:
    """``start-up + drain`` (medians) for one consumer, or what kept it from running."""
    s = status(rounds, key)
    if s:
        return "n/a" if s == "-" and key == "p" else s
    up, drained = median_of(rounds, key, "walsender up"), _drained(rounds, key)
    if up is None or not drained:
        return "-"
    return f"{up:.2f} + {statistics.median(drained):.2f} s"


def split_table(version: int, results: dict[str, dict[str, Any]]) -> list[str]:
    """Each consumer's time split at the moment its walsender connected: its own
    start-up (a process exec'd, a worker forked by the launcher) and the drain."""
    lines = [
        f"| workload | {builtin_header(version)} | pglogical | applier "
        "| drain only: applier/built-in |",
        "|---|---|---|---|---|",
    ]
    for res in results.values():
        rounds: list[Round] = res["rounds"]
        a, b = _drained(rounds, "a"), _drained(rounds, "b")
        r = "-"
        if a and b and not status(rounds, "a") and not status(rounds, "b"):
            r = f"{statistics.median(a) / statistics.median(b):.2f}"
        lines.append(
            f"| {res['describe']} | {start_drain(rounds, 'b')} | {start_drain(rounds, 'p')} "
            f"| {start_drain(rounds, 'a')} | {r} |"
        )
    return lines


def per_consumer(res: dict[str, Any]) -> list[str]:
    """Every figure's median per consumer (CPU seconds, peak RSS MB, start-up)."""
    rounds: list[Round] = res["rounds"]
    lines = [f"{res['describe']} (median of {len(rounds)}):"]
    for key, label in LABELS.items():
        s = status(rounds, key)
        if s == "-":
            continue
        if s:
            why = next((r[key].get("skipped") or "" for r in rounds if key in r), "")
            lines.append(f"  {label:28s} {s} {why}")
            continue
        figs = sorted({f for r in rounds for f in r.get(key, {}) if f != "time"})
        parts = []
        for f in figs:
            v = median_of(rounds, key, f)
            if v is None:
                continue
            if f in COUNTS:
                parts.append(f"{f} {v:,.0f}")
            elif f.startswith("rss"):
                parts.append(f"{f} {v:.0f} MB")
            else:
                parts.append(f"{f} {v:.2f} s")
        lines.append(f"  {label:28s} {cell(rounds, key):>9s}  " + ", ".join(parts))
    return lines


def workers_table(results: dict[str, dict[str, Any]]) -> list[str]:
    """applier on its defaults ("a") against ``[apply] workers = N`` ("aw"): time,
    and CPU per source transaction of the main thread (the worker; with N
    sessions the leader) and of the whole process (the leader and its sessions)."""
    lines = ["| workload | applier | applier, workers = N | N/1 time | "
             "CPU per txn after start-up, main thread (process): 1 / N |",
             "|---|---|---|---|---|"]  # fmt: skip
    for res in results.values():
        rounds: list[Round] = res["rounds"]
        if not any("aw" in r for r in rounds):
            continue
        # The source transactions (the marker's included): the most any applier
        # counted. (One session counts a group's at its commit's result, which
        # may not be read yet when the marker is seen: its count can lag.)
        n = max((f.get("transactions", 0.0) for r in rounds for f in r.values()), default=0.0)
        lines.append(f"| {res['describe']} | {cell(rounds, 'a')} | {cell(rounds, 'aw')} "
                     f"| {ratio(rounds, 'aw', 'a')} | {per_txn(rounds, 'a', n)} / "
                     f"{per_txn(rounds, 'aw', n)} |")  # fmt: skip
    return lines


def per_txn(rounds: list[Round], key: str, n: float) -> str:
    """CPU per source transaction after the start-up (until the walsender
    connected), main thread (process)."""
    main, proc = (_after_start(rounds, key, f) for f in ("main thread", "process"))
    if not n or main is None or proc is None:
        return "-"
    return f"{_us(main / n)} ({_us(proc / n)})"


def _after_start(rounds: list[Round], key: str, what: str) -> float | None:
    """Median over the rounds of applier's CPU (``what``: main thread, process)
    from its walsender's connection to its stop."""
    vals = [f[f"cpu applier {what}"] - f[f"cpu applier {what} at start"]
            for r in rounds if isinstance((f := r.get(key, {})).get(f"cpu applier {what}"), float)
            and isinstance(f.get(f"cpu applier {what} at start"), float)]  # fmt: skip
    vals = [v for v in vals if not math.isnan(v)]
    return statistics.median(vals) if vals else None


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs" if seconds < 0.01 else f"{seconds:.2f} s"


def big_table(res: dict[str, Any]) -> list[str]:
    rounds: list[Round] = res["rounds"]
    lines = [f"{res['describe']}: peak RSS in MB (median); for server processes "
             "VmHWM, and in brackets without the shared memory they mapped (RssShmem)", "",
             "| consumer | time | consumer process | walsender |", "|---|---|---|---|"]  # fmt: skip
    own = {"b": "apply workers", "p": "apply workers"}
    for key, label in LABELS.items():
        if status(rounds, key) == "-":
            continue
        if key == "a":
            mine = mb(median_of(rounds, key, "rss applier process"))
        else:
            mine = server_rss(rounds, key, own[key]) if key in own else "-"
        lines.append(f"| {label} | {cell(rounds, key)} | {mine} "
                     f"| {server_rss(rounds, key, 'walsender')} |")  # fmt: skip
    return lines


def mb(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def server_rss(rounds: list[Round], key: str, proc: str) -> str:
    return (f"{mb(median_of(rounds, key, f'rss {proc}'))} "
            f"({mb(median_of(rounds, key, f'rss-private {proc}'))})")  # fmt: skip


def steady_table(describe: str, rounds: list[Round]) -> list[str]:
    lines = [f"{describe} (median of {len(rounds)} windows per consumer)", "",
             "| consumer | p50 lag | p99 lag | max lag | lag at end | catch-up after end "
             "| kept up |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for key, label in LABELS.items():
        s = status(rounds, key)
        if s == "-":
            continue
        if s:
            lines.append(f"| {label} | {s} | | | | | |")
            continue
        m = {f: median_of(rounds, key, f) or 0.0 for f in ("p50", "p99", "max", "end", "catch-up")}
        lines.append(
            f"| {label} | {m['p50']:.3f} s | {m['p99']:.3f} s | {m['max']:.3f} s "
            f"| {m['end']:.3f} s | {m['catch-up']:.2f} s | {'yes' if m['catch-up'] < 1 else 'no'} |"
        )
    lines.append("")
    lines.append(
        "(pg_recvlogical is left out of the steady state: it writes no table to read a lag from.)"
    )
    return lines
