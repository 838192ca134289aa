"""The watchdog's rule for the end of a run (launcher/runners/held.py): once a rank has exited
cleanly, the others get train.hang_timeout (from that exit or their own latest phase, plus the
phase's bound), and the run's work is complete and saved when the final checkpoint is in place
and metrics.jsonl holds every step. Times are given (`now=`), not waited for."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import psutil

from launcher.rundir import heartbeat_file
from launcher.runners.hang_ranks import Rank
from launcher.runners.held import held_ranks

TIMEOUT = 10.0
STEPS = 3


def live_rank(run_dir: Path, rank: int, at: float, **beat: Any) -> Rank:
    """A rank still running (this test's own process stands for it), past its training."""
    record = {"rank": rank, "host": "h", "pid": os.getpid(), "phase": "evaluation", "time": at}
    return Rank(rank, psutil.Process(), {**record, "timeout": TIMEOUT, "ended": True, **beat})


def exit_beat(run_dir: Path, rank: int, at: float, status: int = 0, **beat: Any) -> None:
    path = heartbeat_file(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "host": "h", "pid": 1, "phase": "exit", "status": status, "time": at}
    path.write_text(json.dumps({**record, **beat}))


def saved_run(run_dir: Path, logged: int = STEPS) -> str:
    final = run_dir / "checkpoints" / f"step_{STEPS}"
    final.mkdir(parents=True)
    lines = [json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, logged + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(lines))
    return str(final)


def test_a_rank_still_running_a_timeout_after_a_clean_exit_holds_a_complete_run(
    tmp_path: Path,
) -> None:
    start = psutil.Process().create_time()
    final = saved_run(tmp_path)
    exit_beat(tmp_path, 0, start + 100, final_checkpoint=final, steps=STEPS)
    rank1 = live_rank(tmp_path, 1, start + 50)
    assert held_ranks(tmp_path, [rank1], now=start + 100 + TIMEOUT - 1) is None  # in time yet
    held = held_ranks(tmp_path, [rank1], now=start + 100 + TIMEOUT + 1)
    assert held is not None and held.late == [rank1] and [e["rank"] for e in held.exited] == [0]
    assert held.complete and "complete and saved" in held.work()


def test_the_work_is_not_complete_without_every_steps_metrics_or_the_checkpoint(
    tmp_path: Path,
) -> None:
    start = psutil.Process().create_time()
    final = saved_run(tmp_path, logged=STEPS - 1)
    exit_beat(tmp_path, 1, start + 100, final_checkpoint=final, steps=STEPS)
    held = held_ranks(tmp_path, [live_rank(tmp_path, 0, start + 50)], now=start + 200)
    assert held is not None and not held.complete
    assert f"metrics.jsonl stops at step {STEPS - 1} of {STEPS}" in held.work()
    exit_beat(tmp_path, 1, start + 100, steps=STEPS)  # no final checkpoint (disabled)
    held = held_ranks(tmp_path, [live_rank(tmp_path, 0, start + 50)], now=start + 200)
    assert held is not None and not held.complete and "no final checkpoint" in held.work()


def test_no_clock_without_a_clean_exit_of_this_attempt(tmp_path: Path) -> None:
    start = psutil.Process().create_time()
    rank1 = live_rank(tmp_path, 1, start + 50)
    exit_beat(tmp_path, 0, start + 100, status=1)  # a failure: torchrun's agent ends the job
    assert held_ranks(tmp_path, [rank1], now=start + 1000) is None
    exit_beat(tmp_path, 0, start - 5)  # an earlier attempt's, before these ranks started
    assert held_ranks(tmp_path, [rank1], now=start + 1000) is None
    exit_beat(tmp_path, 0, start + 100)
    training = live_rank(tmp_path, 1, start + 50, ended=False)  # its step deadlines time it
    assert held_ranks(tmp_path, [training], now=start + 1000) is None
    assert held_ranks(tmp_path, [rank1], now=start + 1000) is not None


def test_a_later_phase_and_its_own_bound_move_the_deadline(tmp_path: Path) -> None:
    start = psutil.Process().create_time()
    exit_beat(tmp_path, 1, start + 100)
    waiting = live_rank(tmp_path, 0, start + 150, phase="harness wait", allow_s=60.0)
    assert held_ranks(tmp_path, [waiting], now=start + 150 + TIMEOUT + 59) is None
    assert held_ranks(tmp_path, [waiting], now=start + 150 + TIMEOUT + 61) is not None


def test_a_ranks_end_phases_carry_what_the_watchdog_reads(tmp_path: Path) -> None:
    from launcher.worker.heartbeat import Heartbeat

    heartbeat = Heartbeat(tmp_path, 1, TIMEOUT, saves_after=lambda step: step >= STEPS)
    heartbeat.end()
    heartbeat.phase("evaluation", final_checkpoint="ck", steps=STEPS)
    heartbeat.phase("harness wait", allow_s=30.0)
    beat = json.loads(heartbeat.path.read_text())
    assert (beat["phase"], beat["deadline"], beat["allow_s"]) == ("harness wait", None, 30.0)
    assert (beat["ended"], beat["final_checkpoint"], beat["steps"]) == (True, "ck", STEPS)
    heartbeat.exit(0)
    beat = json.loads(heartbeat.path.read_text())
    assert (beat["phase"], beat["status"], beat["final_checkpoint"]) == ("exit", 0, "ck")


def test_a_rank_no_watchdog_reads_writes_nothing_through_its_end(tmp_path: Path) -> None:
    from launcher.worker.heartbeat import Silent

    silent = Silent()  # train.hang_timeout=0, or the in-process run
    silent.untimed_after(lambda step: False)
    silent.before_step(1)
    silent.after_step(1)
    silent.end()
    silent.phase("evaluation", final_checkpoint="ck", steps=1)
    silent.exit(0)
    assert not list(tmp_path.iterdir())
