"""No rank can hold a finished job: the hang watchdog's rule for the end of a run
(launcher/runners/watchdog.py).

A rank's last heartbeat record is `exit`, with its exit status (launcher/worker/heartbeat.py).
Once one rank has exited cleanly (status 0 and its process gone, on this node or another), every
rank still running must follow within train.hang_timeout of that exit or of the start of its own
latest phase (final save, evaluation, harness wait, tracker finish, teardown), whichever is later,
plus the phase's own bound (`allow_s`: eval.harness.wait_s for the harness wait). One that does
not holds the job: the watchdog names it with its stack in hang_report.txt, ends this node's
ranks, and says whether the run's work is complete and saved: metrics.jsonl holding every step
and the final checkpoint in place (none is expected with checkpoint.enabled=false).

- complete: the agent ends at once (a torchrun restart would redo nothing), the job exits
  COMPLETE_HELD and summary.json (rank 0's, when it wrote one) says which rank held it;
- not complete: a hang like any other (a restart where train.max_restarts allows, else HUNG;
  its line says a rerun starts over when the run directory holds no complete checkpoint).

A rank that dies or fails once past its training (its last heartbeat says `ended`) when the
work is complete and saved is no failure either: COMPLETE_HELD, naming it (died_after_work).
"""

from __future__ import annotations

import json
import signal
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from launcher.checkpoint.files import find_checkpoints
from launcher.exit_codes import COMPLETE_HELD
from launcher.logs import get_logger
from launcher.rundir import SUMMARY_FILE, heartbeat_file, heartbeat_files
from launcher.runners.hang_ranks import Rank, attempt_beats, rank_of, read_beat
from launcher.tracking.run_end import blamed_elsewhere, last_logged_step, write_hung_summary
from launcher.userpath.own import replace_own
from launcher.worker.heartbeat import EXIT_PHASE

log = get_logger("stop")

COMPLETE_STATUS = "completed"


@dataclass(frozen=True)
class Work:
    """What the run has saved, as its ranks' heartbeats and the run directory say."""

    final_checkpoint: str | None
    steps: int | None
    logged: int
    """The last step in metrics.jsonl."""
    checkpoints: bool = True
    """checkpoint.enabled: with false, metrics.jsonl holding every step is the whole work."""

    @property
    def saved(self) -> bool:
        return self.final_checkpoint is not None and Path(self.final_checkpoint).is_dir()

    @property
    def complete(self) -> bool:
        """Metrics for every step written and (checkpoint.enabled=false or the final checkpoint
        in place)."""
        return (
            self.steps is not None
            and self.logged >= self.steps
            and (self.saved or not self.checkpoints)
        )

    def work(self) -> str:
        """Whether the run's work is complete and saved, in words."""
        if self.complete:
            where = (
                f"final checkpoint {self.final_checkpoint}"
                if self.checkpoints
                else "checkpoint.enabled=false"
            )
            return (
                f"the run's work is complete and saved ({where}, metrics.jsonl to step "
                f"{self.logged})"
            )
        missing = (
            "no final checkpoint"
            if self.checkpoints and not self.saved
            else f"metrics.jsonl stops at step {self.logged} of {self.steps}"
        )
        return f"the run's work is not complete ({missing})"


def work_of(run_dir: Path, beats: list[dict[str, Any]]) -> Work:
    """The run's work from its ranks' end records (launcher/worker/heartbeat.py)."""
    final = next((str(b["final_checkpoint"]) for b in beats if b.get("final_checkpoint")), None)
    steps = next((int(b["steps"]) for b in beats if b.get("steps")), None)
    enabled = all(b.get("checkpoints", True) is not False for b in beats)
    return Work(final, steps, last_logged_step(run_dir), enabled)


@dataclass(frozen=True)
class Held(Work):
    """Ranks still running past their time after a clean exit, and what the run has saved."""

    late: list[Rank] = field(default_factory=list)
    exited: list[dict[str, Any]] = field(default_factory=list)
    """The clean exits' records (or the records of the ranks that finished the final save)."""
    after: str = "exited cleanly"


def clean_exits(run_dir: Path, live: list[Rank]) -> list[dict[str, Any]]:
    """This attempt's ranks that exited with status 0; a record of a process still running (it
    hangs in its interpreter's exit) does not count."""
    running = {(r.beat.get("host"), r.proc.pid) for r in live}
    return [
        b
        for b in attempt_beats(run_dir, live, EXIT_PHASE)
        if b.get("status") == 0 and (b.get("host"), b.get("pid")) not in running
    ]


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
    work = work_of(run_dir, [*exits, *(r.beat for r in live)])
    return Held(**vars(work), late=late, exited=exits)


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
        f"after {exited} {held.after}; {held.work()}; stacks in {report}"
    )


def training_over(run_dir: Path, procs: list[psutil.Process]) -> tuple[Work, set[str]] | None:
    """The run's work and the ranks' phases when every rank still running is past its last step
    (its own heartbeat says `ended`); None while any is training or unknown (no heartbeat of its
    process yet)."""
    if not procs:
        return None
    phases = set()
    for proc in procs:
        rank = rank_of(proc)
        beat = read_beat(heartbeat_file(run_dir, rank)) if rank is not None else None
        if beat is None or beat.get("pid") != proc.pid or not beat.get("ended"):
            return None
        phases.add(str(beat.get("phase")))
    beats = [read_beat(path) for path in heartbeat_files(run_dir)]
    return work_of(run_dir, [b for b in beats if b is not None]), phases


def ended_after_training(work: Work, run_dir: Path) -> int:
    """The last line and the exit status of a job a SIGTERM ended once training was over:
    COMPLETE_HELD when the work is complete and saved, else 128 + SIGTERM."""
    if work.complete:
        log.error(
            f"ended on SIGTERM after training was over; {work.work()}: exit {COMPLETE_HELD}. "
            "Nothing to rerun."
        )
        return COMPLETE_HELD
    code = 128 + signal.SIGTERM
    log.error(
        f"ended on SIGTERM after training was over; {work.work()}: exit {code}; {rerun(run_dir)}."
    )
    return code


def rerun(run_dir: Path | None) -> str:
    """What a rerun of a job that did not finish does: resume, or start over when no complete
    checkpoint is in the run directory (checkpoint.enabled=false, or none saved yet)."""
    if run_dir is None:
        return "a rerun resumes from the last complete checkpoint, if one was saved"
    if find_checkpoints(run_dir, warn=False, verify=False):
        return "a rerun resumes from the last complete checkpoint"
    return "no checkpoint was saved: a rerun starts over"


def hang_exit_line(hangs: list[dict[str, Any]], code: int, run_dir: Path | None) -> str:
    """The last line of a job the watchdog ended with no restart left."""
    last = hangs[-1]
    ranks = ", ".join(str(r) for r in last["ranks"])
    named = None if ranks or run_dir is None else blamed_elsewhere(run_dir, last)
    who = f"rank {ranks}" if ranks else "a rank on another node"
    if named is not None:  # this node's ranks only waited: the node of the rank named it
        hosts = ", ".join(named.get("hosts") or ["another node"])
        who = f"rank {', '.join(str(r) for r in named['ranks'])} on {hosts}, named by its node"
    return (
        f"the job hung ({who}, train.hang_timeout={last['hang_timeout']:g} s) and no "
        f"restart was left: exit {code}. Report: {last['report']}; {rerun(run_dir)}."
    )


def saved_where(hang: dict[str, Any]) -> str:
    if hang.get("checkpoints") is False:
        return "checkpoint.enabled=false: metrics.jsonl holds every step"
    return f"final checkpoint {hang.get('final_checkpoint')}"


def held_exit_line(hang: dict[str, Any], code: int, summary: bool = True) -> str:
    """The last line of a job that a rank held after its work was complete and saved (summary:
    whether rank 0 wrote summary.json, write_held_summary)."""
    ranks = ", ".join(str(r) for r in hang["ranks"])
    missing = "" if summary else f" (but {MISSING})"
    return (
        f"rank {ranks} held the job after the run's work was complete and saved "
        f"({saved_where(hang)}); ended after train.hang_timeout={hang['hang_timeout']:g} s: "
        f"exit {code}. Nothing to rerun{missing}; report: {hang['report']}"
    )


def died_after_work(run_dir: Path, failures: list[Any]) -> dict[str, Any] | None:
    """A record of ranks that died or failed (torchrun's RankFailure) when every one of them was
    past its training (its last heartbeat says so) and the run's work was complete and saved;
    else None (a failure like any other)."""
    beats = [read_beat(path) for path in heartbeat_files(run_dir)]
    by_rank = {b.get("rank"): b for b in beats if b is not None}
    if not failures or not all(by_rank.get(f.rank, {}).get("ended") for f in failures):
        return None
    work = work_of(run_dir, list(by_rank.values()))
    if not work.complete:
        return None
    how = [
        f"rank {f.rank} ({f.signal or 'status'}, exit {f.exitcode}, in "
        f"{by_rank[f.rank].get('phase')})"
        for f in failures
    ]
    return {
        "ranks": [f.rank for f in failures],
        "how": how,
        "complete": True,
        "checkpoints": work.checkpoints,
        "final_checkpoint": work.final_checkpoint,
        "since": 0,
    }


def died_exit_line(died: dict[str, Any], code: int) -> str:
    """The last line of a job a rank left by dying after the run's work was complete and saved."""
    return (
        f"{', '.join(died['how'])} died after the run's work was complete and saved "
        f"({saved_where(died)}): exit {code}. Nothing to rerun."
    )


MISSING = "rank 0 did not finish: no end-of-run evaluation, and summary.json has no figures"


def write_held_summary(run_dir: Path, hang: dict[str, Any], code: int, key: str = "hang") -> bool:
    """summary.json of a complete run a rank held: rank 0's, with the hang and the exit status
    added, when it wrote one in this attempt (True); else the summary of a hung run, completed."""
    path = run_dir / SUMMARY_FILE
    values: dict[str, Any] | None = None
    with suppress(OSError, ValueError):
        if path.stat().st_mtime >= float(hang.get("since", 0)):
            values = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(values, dict):
        write_hung_summary(run_dir, hang, code, status=COMPLETE_STATUS)
        return False
    values.update({"exit_status": code, key: hang})
    replace_own(path, json.dumps(values, indent=2, default=str) + "\n")
    return True
