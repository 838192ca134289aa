"""A rank wedged in the final save (launcher/runners/held.py's rule, before any rank can exit).

A save is not timed (a large checkpoint takes what it takes), and no rank leaves the final save
before all have written their part (the save is collective), so no clean exit ever starts the
clock of held.py. Instead each rank's heartbeat says when its own part of the final save is done
(`final save written`: its files written, and for rank 0 the completion record too; it then
waits for the others). Once any rank has done its part, the ranks still in `final save` get
train.hang_timeout from that moment (or from their own latest record, if later): one that does
not finish holds the job and is named with its stack like a rank held at the end; the run's
work is not complete (no final checkpoint), so it is a hang like any other (a restart where
train.max_restarts allows, else HUNG).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.runners.hang_ranks import Rank, attempt_beats
from launcher.runners.held import Held, deadline, work_of
from launcher.worker.heartbeat import FINAL_SAVE, SAVE_WRITTEN


def parts_written(run_dir: Path, live: list[Rank]) -> list[dict[str, Any]]:
    """This attempt's records (any node's) of ranks that have done their part of the final
    save and wait for the others."""
    return attempt_beats(run_dir, live, SAVE_WRITTEN)


def held_in_save(run_dir: Path, live: list[Rank], now: float) -> Held | None:
    """The ranks still in the final save train.hang_timeout after a peer finished its part;
    None when none is late (or no peer has finished its part)."""
    if not live or not all(r.ended for r in live):
        return None
    written = parts_written(run_dir, live)
    saving = [r for r in live if r.beat.get("phase") == FINAL_SAVE]
    if not written or not saving:
        return None
    done_at = min(float(b["time"]) for b in written)
    late = [r for r in saving if now > deadline(r, done_at) and float(r.beat.get("timeout") or 0)]
    if not late:
        return None
    work = work_of(run_dir, [*written, *(r.beat for r in live)])
    return Held(
        **vars(work), late=late, exited=written, after="finished its part of the final save"
    )
