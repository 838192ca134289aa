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

from launcher.checkpoint.files import MARKER, META, find_checkpoints, manifest
from launcher.events import record_event
from launcher.rundir import heartbeat_file
from launcher.runners.agent import RankFailure
from launcher.runners.hang_ranks import Rank
from launcher.runners.held import (
    died_after_work,
    died_exit_line,
    hang_exit_line,
    held_exit_line,
    held_ranks,
)

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

    silent = Silent()  # the in-process run (no watchdog)
    silent.untimed_after(lambda step: False)
    silent.before_step(1)
    silent.after_step(1)
    silent.end()
    silent.phase("evaluation", final_checkpoint="ck", steps=1)
    silent.exit(0)
    assert not list(tmp_path.iterdir())


def test_with_checkpoints_off_every_steps_metrics_is_the_whole_work(tmp_path: Path) -> None:
    # checkpoint.enabled=false: no final checkpoint is expected; metrics.jsonl decides.
    start = psutil.Process().create_time()
    saved_run(tmp_path)
    exit_beat(tmp_path, 0, start + 100, steps=STEPS, checkpoints=False)
    held = held_ranks(tmp_path, [live_rank(tmp_path, 1, start + 50)], now=start + 200)
    assert held is not None and held.complete, held
    assert "complete and saved (checkpoint.enabled=false, metrics.jsonl to step 3)" in held.work()
    hang = {"ranks": [1], "hang_timeout": TIMEOUT, "report": "r", "checkpoints": False}
    assert "checkpoint.enabled=false" in held_exit_line(hang, 77)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    held = held_ranks(tmp_path, [live_rank(tmp_path, 1, start + 50)], now=start + 200)
    assert held is not None and not held.complete
    assert "metrics.jsonl stops at step 1 of 3" in held.work()


def test_a_hung_job_without_a_checkpoint_is_not_said_to_resume(tmp_path: Path) -> None:
    hangs = [{"ranks": [1], "hang_timeout": TIMEOUT, "report": "r"}]
    line = hang_exit_line(hangs, 76, tmp_path)
    assert "no checkpoint was saved: a rerun starts over" in line and "resumes" not in line
    final = Path(saved_run(tmp_path))  # a complete checkpoint (its marker) in the run directory
    (final / META).write_text(json.dumps({"step": STEPS}))
    (final / MARKER).write_text(json.dumps(manifest(final)))
    assert find_checkpoints(tmp_path, warn=False, verify=False)
    line = hang_exit_line(hangs, 76, tmp_path)
    assert "a rerun resumes from the last complete checkpoint" in line


def test_a_node_whose_ranks_only_waited_names_the_rank_another_node_named(tmp_path: Path) -> None:
    mine = record_event(tmp_path, "hang", ranks=[], hosts=[], hang_timeout=TIMEOUT, report="r")
    line = hang_exit_line([mine], 76, tmp_path)
    assert "the job hung (a rank on another node," in line  # none named it (yet)
    record_event(tmp_path, "hang", ranks=[1], hosts=["node-b"], hang_timeout=TIMEOUT, report="r")
    line = hang_exit_line([mine], 76, tmp_path)
    assert "the job hung (rank 1 on node-b, named by its node, train.hang_timeout=" in line


def test_a_rank_killed_after_the_work_was_saved_leaves_it_complete(tmp_path: Path) -> None:
    start = psutil.Process().create_time()
    final = saved_run(tmp_path)
    exit_beat(tmp_path, 0, start + 100, final_checkpoint=final, steps=STEPS)
    killed = [RankFailure(1, -9, int(start) + 120)]
    exit_beat(tmp_path, 1, start + 90, phase="evaluation", ended=True)  # its last record
    died = died_after_work(tmp_path, killed)
    assert died is not None and died["ranks"] == [1] and died["final_checkpoint"] == final
    line = died_exit_line(died, 77)
    assert line.startswith("rank 1 (SIGKILL, exit -9, in evaluation) died after the run's work")
    assert f"complete and saved (final checkpoint {final}): exit 77. Nothing to rerun" in line
    exit_beat(tmp_path, 1, start + 90, phase="step", ended=False)  # killed while training
    assert died_after_work(tmp_path, killed) is None
    exit_beat(tmp_path, 1, start + 90, phase="evaluation", ended=True)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")  # work not complete
    assert died_after_work(tmp_path, killed) is None


def test_training_is_over_only_when_every_running_rank_says_so(tmp_path: Path) -> None:
    """What a SIGTERM to `launch` reads (launcher/runners/signals.py): a real rank-like process
    (RANK=1), its own heartbeat record, and rank 0's exit with the saved work."""
    import subprocess
    import sys

    from launcher.runners.held import training_over

    env = {**os.environ, "RANK": "1"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        proc = psutil.Process(child.pid)
        final = saved_run(tmp_path)
        exit_beat(tmp_path, 0, 100.0, final_checkpoint=final, steps=STEPS)
        exit_beat(tmp_path, 1, 100.0, pid=child.pid, phase="step", ended=False)
        assert training_over(tmp_path, [proc]) is None  # still training
        exit_beat(tmp_path, 1, 100.0, pid=child.pid + 1, phase="evaluation", ended=True)
        assert training_over(tmp_path, [proc]) is None  # another process's record
        exit_beat(tmp_path, 1, 100.0, pid=child.pid, phase="evaluation", ended=True)
        over = training_over(tmp_path, [proc])
        assert over is not None and over[1] == {"evaluation"}
        assert over[0].complete and over[0].final_checkpoint == final
    finally:
        child.kill()
        child.wait(timeout=30)


def test_with_no_hang_timeout_the_phases_are_written_without_deadlines(tmp_path: Path) -> None:
    from launcher.worker.heartbeat import Heartbeat

    heartbeat = Heartbeat(tmp_path, 0, 0.0, saves_after=lambda step: step >= STEPS)
    heartbeat.before_step(1)
    heartbeat.after_step(1)
    assert json.loads(heartbeat.path.read_text())["deadline"] is None  # nothing is timed
    heartbeat.end()
    assert json.loads(heartbeat.path.read_text())["ended"] is True


def test_a_rank_still_in_the_final_save_a_timeout_after_a_peer_finished_its_part(
    tmp_path: Path,
) -> None:
    """launcher/runners/held_save.py: the final save is collective, so no rank exits while one
    is wedged in it; a peer's `final save written` record starts the clock instead."""
    from launcher.runners.held import held_line
    from launcher.runners.held_save import held_in_save

    start = psutil.Process().create_time()
    saving = live_rank(tmp_path, 0, start + 50, phase="final save")
    assert held_in_save(tmp_path, [saving], now=start + 1000) is None  # no peer done yet
    exit_beat(tmp_path, 1, start + 100, phase="final save written", ended=True)
    assert held_in_save(tmp_path, [saving], now=start + 100 + TIMEOUT - 1) is None  # in time
    held = held_in_save(tmp_path, [saving], now=start + 100 + TIMEOUT + 1)
    assert held is not None and held.late == [saving] and not held.complete
    line = held_line(held, {0: "no exit"}, tmp_path / "hang_report.txt")
    assert "rank 0 on h (no exit, in final save) still running" in line, line
    assert "after rank 1 finished its part of the final save" in line, line
    waiting = live_rank(tmp_path, 0, start + 50, phase="final save written")
    assert held_in_save(tmp_path, [waiting], now=start + 1000) is None  # done, waits for peers
    exit_beat(tmp_path, 1, start - 5, phase="final save written", ended=True)  # an earlier attempt
    assert held_in_save(tmp_path, [saving], now=start + 1000) is None


def test_a_ranks_part_of_the_final_save_is_reported(tmp_path: Path) -> None:
    """Heartbeat.end(checkpoints): files written -> `final save written`; rank 0 back in
    `final save` for the completion record, `final save written` once it is in place."""
    from types import SimpleNamespace
    from typing import cast

    from launcher.checkpoint.checkpointer import Checkpointer
    from launcher.worker.heartbeat import Heartbeat

    paused: list[int] = []
    checkpoints = SimpleNamespace(before_marker=paused.append, after_commit=None)
    heartbeat = Heartbeat(tmp_path, 0, TIMEOUT, saves_after=lambda step: step >= STEPS)
    heartbeat.end(cast(Checkpointer, checkpoints))

    def phase() -> str:
        return str(json.loads(heartbeat.path.read_text())["phase"])

    assert phase() == "final save"
    checkpoints.rank_written()
    assert phase() == "final save written"
    checkpoints.before_marker(STEPS)
    assert phase() == "final save" and paused == [STEPS]  # the test's pause still runs
    checkpoints.after_commit(STEPS, tmp_path)
    assert phase() == "final save written"


def test_a_held_rank_0_is_said_to_have_left_no_figures(tmp_path: Path) -> None:
    from launcher.runners.held import write_held_summary

    hang = {"ranks": [0], "hang_timeout": TIMEOUT, "report": "r", "final_checkpoint": "ck"}
    assert not write_held_summary(tmp_path, {**hang, "since": 0}, 77)  # rank 0 wrote none
    line = held_exit_line(hang, 77, summary=False)
    assert "Nothing to rerun (but rank 0 did not finish: no end-of-run evaluation" in line
    assert write_held_summary(tmp_path, {**hang, "since": 0}, 77)  # one is there now
    assert "did not finish" not in held_exit_line(hang, 77)
