"""What the run directory says of a run whose ranks could not say it: the last step it logged,
and summary.json of a run the hang watchdog ended (its ranks were killed before rank 0 could write
one), so that every ended run has a summary with its events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.events import blamed_hang, read_events
from launcher.rundir import METRICS_FILE, SUMMARY_FILE
from launcher.userpath.own import replace_own

HUNG_STATUS = "hung"
UNMEASURED_KEYS = (
    "final_loss",
    "tokens_per_s",
    "world_size",
    "grad_accum",
    "peak_memory_bytes",
    "activation_bytes",
)
SAME_HANG_S = 60.0
"""Nodes' records of one hang are this close in time (each watchdog fires within its poll)."""


def last_logged_step(run_dir: Path) -> int:
    """The highest step in metrics.jsonl (0: none); lines cut short by a kill are skipped."""
    last = 0
    try:
        lines = (run_dir / METRICS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0
    for line in lines:
        try:
            last = max(last, int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            continue
    return last


def blamed_elsewhere(
    run_dir: Path, hang: dict[str, Any], events: list[dict[str, Any]] | None = None
) -> dict[str, Any] | None:
    """Another node's record of the same hang that names the rank (this node's ranks only
    waited for it), or None."""
    found = read_events(run_dir) if events is None else events
    return blamed_hang(found, float(hang.get("time", 0)), SAME_HANG_S)


def peer_named_hang(run_dir: Path, failed_at: float) -> list[dict[str, Any]]:
    """This node's record of a hang another node's watchdog named, when this node's ranks failed
    at `failed_at` (seconds since the epoch) only because that watchdog killed the hung rank: a
    collective lost its peer before this node's own watchdog fired. [] when no such record."""
    named = blamed_elsewhere(run_dir, {"time": failed_at})
    if named is None or float(named["time"]) > failed_at + 1:  # failures are whole seconds
        return []
    keep = ("hang_timeout", "report")
    return [{"ranks": [], "time": failed_at, **{k: named.get(k) for k in keep}}]


def write_hung_summary(
    run_dir: Path, hang: dict[str, Any], exit_status: int, status: str = HUNG_STATUS
) -> dict[str, Any]:
    """summary.json of a job the watchdog ended with no restart left; the values written. `hang`
    is this node's record; where it names no rank (all waited for a peer), another node's record
    of the same hang that names one is taken instead. status: "completed" when a rank held a run
    whose work was complete and saved (launcher/runners/held.py)."""
    events = read_events(run_dir)
    if not hang.get("ranks"):
        hang = blamed_elsewhere(run_dir, hang, events) or hang
    values = {
        "steps": last_logged_step(run_dir),
        # The contract's keys of a completed run; no rank lived to measure them.
        **dict.fromkeys(UNMEASURED_KEYS),
        "status": status,
        "exit_status": exit_status,
        "hang": hang,
        "events": events,
    }
    replace_own(run_dir / SUMMARY_FILE, json.dumps(values, indent=2, default=str) + "\n")
    return values
