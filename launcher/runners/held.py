"""No rank can hold a finished job: the hang watchdog's rule for the end of a run
(launcher/runners/watchdog.py).

A rank's last heartbeat record is `exit`, with its exit status (launcher/worker/heartbeat.py).
Once one rank has exited cleanly (status 0 and its process gone, on this node or another), every
rank still running must follow within train.hang_timeout of that exit or of the start of its own
latest phase (final save, evaluation, harness wait, tracker finish, teardown), whichever is later,
plus the phase's own bound (`allow_s`: eval.harness.wait_s for the harness wait). One that does
not holds the job: the watchdog names it with its stack in hang_report.txt, ends this node's
ranks, and says whether the run's work is complete and saved: the final checkpoint in place and
metrics.jsonl holding every step.

- complete: the agent ends at once (a torchrun restart would redo nothing), the job exits
  COMPLETE_HELD and summary.json (rank 0's, when it wrote one) says which rank held it;
- not complete: a hang like any other (a restart where train.max_restarts allows, else HUNG).
"""

from __future__ import annotations

import json
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from launcher.rundir import SUMMARY_FILE, heartbeat_files
from launcher.runners.hang_ranks import Rank, read_beat
from launcher.tracking.run_end import last_logged_step, write_hung_summary
from launcher.userpath.own import replace_own
from launcher.worker.heartbeat import EXIT_PHASE

COMPLETE_STATUS = "completed"


@dataclass(frozen=True)
class Held:
    """Ranks still running past their time after a clean exit, and what the run has saved."""

    late: list[Rank]
    exited: list[dict[str, Any]]
    """The clean exits' records."""
    final_checkpoint: str | None
    steps: int | None
    logged: int
    """The last step in metrics.jsonl."""

    @property
    def complete(self) -> bool:
        return (
            self.final_checkpoint is not None
            and Path(self.final_checkpoint).is_dir()
            and self.steps is not None
            and self.logged >= self.steps
        )

    def work(self) -> str:
        """Whether the run's work is complete and saved, in words."""
        if self.complete:
            return (
                f"the run's work is complete and saved (final checkpoint {self.final_checkpoint}, "
                f"metrics.jsonl to step {self.logged})"
            )
        missing = (
            "no final checkpoint"
            if self.final_checkpoint is None or not Path(self.final_checkpoint).is_dir()
            else f"metrics.jsonl stops at step {self.logged} of {self.steps}"
        )
        return f"the run's work is not complete ({missing})"


def attempt_started(live: list[Rank]) -> float:
    """When this attempt's ranks started: exits recorded before are an earlier attempt's."""
    times = []
    for r in live:
        with suppress(psutil.Error):
            times.append(r.proc.create_time())
    return min(times, default=time.time())


def clean_exits(run_dir: Path, live: list[Rank]) -> list[dict[str, Any]]:
    """This attempt's ranks that exited with status 0 (any node's: the run directory is shared);
    a record of a process still running (it hangs in its interpreter's exit) does not count."""
    running = {(r.beat.get("host"), r.proc.pid) for r in live}
    since = attempt_started(live)
    found = []
    for path in heartbeat_files(run_dir):
        beat = read_beat(path)
        if (
            beat is not None
            and beat.get("phase") == EXIT_PHASE
            and beat.get("status") == 0
            and float(beat.get("time", 0)) >= since
            and (beat.get("host"), beat.get("pid")) not in running
        ):
            found.append(beat)
    return found


def deadline(rank: Rank, exited_at: float) -> float:
    """When `rank` must have exited, once a peer exited cleanly at `exited_at`."""
    beat = rank.beat
    since = max(exited_at, float(beat.get("time", 0)))
    return since + float(beat.get("timeout") or 0) + float(beat.get("allow_s") or 0)


def held_ranks(run_dir: Path, live: list[Rank], now: float | None = None) -> Held | None:
    """The ranks holding a job that a peer has left cleanly; None when none is late (or no peer
    has exited). Looked for only once every rank here is past its training."""
    if not live or not all(r.ended for r in live):
        return None
    exits = clean_exits(run_dir, live)
    if not exits:
        return None
    exited_at = min(float(e["time"]) for e in exits)
    now = time.time() if now is None else now
    late = [r for r in live if now > deadline(r, exited_at) and float(r.beat.get("timeout") or 0)]
    if not late:
        return None
    beats = [*exits, *(r.beat for r in live)]
    final = next((str(b["final_checkpoint"]) for b in beats if b.get("final_checkpoint")), None)
    steps = next((int(b["steps"]) for b in beats if b.get("steps")), None)
    return Held(late, exits, final, steps, last_logged_step(run_dir))


def held_line(held: Held, how: dict[int, str], report: Path) -> str:
    """The log's line and the report's title."""
    names = ", ".join(
        f"rank {r.rank} on {r.beat.get('host')} ({how[r.rank]}, in {r.beat.get('phase')})"
        for r in held.late
    )
    exited = ", ".join(f"rank {e.get('rank')}" for e in held.exited)
    timeout = float(held.late[0].beat.get("timeout") or 0)
    return (
        f"hang at the end of the run: {names} still running {timeout:g} s (train.hang_timeout) "
        f"after {exited} exited cleanly; {held.work()}; stacks in {report}"
    )


def held_exit_line(hang: dict[str, Any], code: int) -> str:
    """The last line of a job that a rank held after its work was complete and saved."""
    ranks = ", ".join(str(r) for r in hang["ranks"])
    return (
        f"rank {ranks} held the job after the run's work was complete and saved (final "
        f"checkpoint {hang.get('final_checkpoint')}); ended after train.hang_timeout="
        f"{hang['hang_timeout']:g} s: exit {code}. Nothing to rerun; report: {hang['report']}"
    )


def write_held_summary(run_dir: Path, hang: dict[str, Any], code: int) -> None:
    """summary.json of a complete run a rank held: rank 0's, with the hang and the exit status
    added, when it wrote one in this attempt; else the summary of a hung run, completed."""
    path = run_dir / SUMMARY_FILE
    values: dict[str, Any] | None = None
    with suppress(OSError, ValueError):
        if path.stat().st_mtime >= float(hang.get("since", 0)):
            values = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(values, dict):
        write_hung_summary(run_dir, hang, code, status=COMPLETE_STATUS)
        return
    values.update(exit_status=code, hang=hang)
    replace_own(path, json.dumps(values, indent=2, default=str) + "\n")
