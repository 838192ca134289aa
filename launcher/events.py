"""events.jsonl: one JSON line per hang, restart or elastic change of a run, written by whoever
saw it (the watchdog in `launch` or a node's agent; rank 0 at a restart).

Each record has at least `event` (hang | restart), `time` (seconds since the epoch) and what
the event is about (ranks, hosts, steps).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from launcher.rundir import EVENTS_FILE
from launcher.userpath.own import open_own


def record_event(run_dir: Path, event: str, **fields: Any) -> dict[str, Any]:
    """Append one record (one write of one line: appends from several processes do not mix)."""
    record = {"event": event, "time": round(time.time(), 3), **fields}
    line = json.dumps(record, default=str) + "\n"
    with open(open_own(run_dir / EVENTS_FILE), "a", encoding="utf-8") as f:  # never via a link
        f.write(line)
    return record


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    try:
        lines = (run_dir / EVENTS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a kill
    return events


def blamed_hang(
    events: list[dict[str, Any]], around: float, within: float
) -> dict[str, Any] | None:
    """The hang record nearest in time to `around` (at most `within` seconds off) that names a
    rank: a node's watchdog found it; the other nodes' records of the same hang name none, their
    ranks only waited for it."""
    named = [
        e
        for e in events
        if e.get("event") == "hang"
        and e.get("ranks")
        and abs(float(e.get("time", 0)) - around) <= within
    ]
    return min(named, key=lambda e: abs(float(e["time"]) - around)) if named else None
