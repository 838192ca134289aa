"""train.hang_timeout: a rank stopped with SIGSTOP mid-run is named (rank, host, state) by the
watchdog beside torchrun's agent, the others' stacks show them waiting in their collective, and
the job ends with HUNG instead of waiting for the process group's timeout. A rank stopped after
the last step cannot hold the finished job, under DDP and ZeRO-3: once its peer has exited
cleanly, it gets train.hang_timeout, is named and ended, and the job exits COMPLETE_HELD."""

from __future__ import annotations

import json
import signal
import time
from contextlib import suppress
from pathlib import Path

import psutil
import pytest

from launcher.events import read_events
from launcher.exit_codes import COMPLETE_HELD, HUNG
from launcher.rundir import HANG_REPORT_FILE
from tests.e2e.test_resume import DP2, Launch, rank_process
from tests.helpers import FAST, read_metrics, read_summary

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]

HANG_TIMEOUT = 4


def test_a_stopped_rank_is_named_with_the_stacks_and_the_job_ends_hung(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = [
        "train",
        "train.steps=200",
        "batch.global_size=8",
        *FAST,
        *DP2,
        "debug.step_sleep_s=0.2",
        f"train.hang_timeout={HANG_TIMEOUT}",
    ]
    launch = Launch(args, run_dir)
    launch.wait_for_step(4)
    stopped = rank_process(launch.proc.pid, 1)
    stopped.suspend()  # SIGSTOP: it cannot answer, not even with its own stack
    try:
        code = launch.wait(timeout=120)  # far less than the process group's 600 s
    finally:
        if stopped.is_running():
            stopped.kill()
    output = launch.output
    assert code == HUNG, output
    assert "hang: rank 1 on " in output and "(stopped)" in output

    report = (run_dir / HANG_REPORT_FILE).read_text()
    first, *_ = report.splitlines()
    assert "rank 1 on " in first and "rank 0 on" not in first, report
    sections = {s.split(" ", 1)[0]: s for s in report.split("--- rank ")[1:]}
    assert "State: T" in sections["1"] and "no progress" in sections["1"], report
    assert "cannot write its own stack" in sections["1"], report
    # Rank 0 answered SIGUSR2 from inside its collective (the step's all-reduce).
    assert "train_step" in sections["0"] and "no progress" not in sections["0"], report

    (hang,) = [e for e in read_events(run_dir) if e["event"] == "hang"]
    assert hang["ranks"] == [1] and hang["stopped"] == [1]
    assert hang["hang_timeout"] == HANG_TIMEOUT
    assert 4 <= hang["steps"]["1"] < 200

    # No rank lived to write summary.json: the agent's side wrote it, with the hang.
    summary = read_summary(run_dir)
    assert (summary["status"], summary["exit_status"]) == ("hung", HUNG), summary
    assert summary["hang"]["ranks"] == [1] and summary["events"][-1]["event"] == "hang", summary
    assert 4 <= summary["steps"] < 200, summary


HELD_TIMEOUT = 6
HELD_STEPS = 4


def test_a_rank_stopped_after_the_last_step_cannot_hold_the_finished_job(tmp_path: Path) -> None:
    """Rank 1 stops itself (SIGSTOP) once the final checkpoint is in place; rank 0 finishes the
    run and exits. The watchdog gives rank 1 train.hang_timeout from that exit, names it and
    ends it, and the job exits COMPLETE_HELD: the run's work is complete and saved. (Under
    ZeRO-3: test_a_held_rank_0_under_zero3_without_checkpoints_is_complete.)"""
    run_dir = tmp_path / "run"
    args = [
        "train",
        f"train.steps={HELD_STEPS}",
        "batch.global_size=8",
        *FAST,
        *DP2,
        f"train.hang_timeout={HELD_TIMEOUT}",
        "train.max_restarts=1",  # not used: the work is saved, the agent ends instead
        "debug.stop_at_end_on_rank=1",
    ]
    launch = Launch(args, run_dir)
    try:
        wait_for_phase(launch, run_dir / "heartbeats" / "rank0.json", "exit")
        code = launch.wait(timeout=HELD_TIMEOUT + 30)  # from rank 0's exit
    finally:
        if launch.proc.poll() is None:  # a failed test: no stopped rank left behind
            for proc in psutil.Process(launch.proc.pid).children(recursive=True):
                proc.kill()
    output = launch.output
    assert code == COMPLETE_HELD, output
    assert "hang at the end of the run: rank 1 on " in output and "(stopped" in output, output
    assert "after rank 0 exited cleanly" in output and "complete and saved" in output, output

    report = (run_dir / HANG_REPORT_FILE).read_text()
    first, *_ = report.splitlines()
    assert "rank 1 on " in first and "rank 0 on" not in first, report
    (section,) = report.split("--- rank ")[1:]  # rank 0 had exited: rank 1 alone
    assert section.startswith("1 ") and "State: T" in section, report
    assert "cannot write its own stack" in section, report

    (hang,) = read_events(run_dir)  # no restart
    assert hang["event"] == "hang", hang
    assert (hang["ranks"], hang["after_exit_of"], hang["complete"]) == ([1], [0], True), hang
    assert hang["stopped"] == [1] and hang["hang_timeout"] == HELD_TIMEOUT

    # The work is intact: the final checkpoint, every step's metrics, rank 0's summary.
    final = run_dir / "checkpoints" / f"step_{HELD_STEPS}"
    assert (final / "complete.json").is_file() and hang["final_checkpoint"] == str(final)
    assert [m["step"] for m in read_metrics(run_dir)] == list(range(1, HELD_STEPS + 1))
    summary = read_summary(run_dir)
    assert (summary["status"], summary["exit_status"]) == ("completed", COMPLETE_HELD), summary
    assert summary["steps"] == HELD_STEPS and summary["final_loss"] is not None, summary
    assert summary["hang"]["ranks"] == [1], summary


def wait_for_phase(launch: Launch, beat: Path, phase: str, timeout: float = 300) -> None:
    """Until the heartbeat record says `phase` (launch must not end first)."""
    deadline = time.monotonic() + timeout
    while True:
        with suppress(OSError, ValueError):
            if json.loads(beat.read_text())["phase"] == phase:
                return
        assert launch.proc.poll() is None, (
            f"launch ended ({launch.proc.returncode}):\n{launch.output}"
        )
        assert time.monotonic() < deadline, f"no {phase} in {beat} in {timeout}s:\n{launch.output}"
        time.sleep(0.1)


def held_launch(tmp_path: Path, *extra: str, held: int = 1) -> tuple[Launch, Path]:
    """A dp=2 run whose rank `held` stops itself after the final save; the other finishes."""
    run_dir = tmp_path / "run"
    args = [
        "train",
        f"train.steps={HELD_STEPS}",
        "batch.global_size=8",
        *FAST,
        *DP2,
        f"debug.stop_at_end_on_rank={held}",
        *extra,
    ]
    return Launch(args, run_dir), run_dir


def end_all(launch: Launch) -> None:
    if launch.proc.poll() is None:  # a failed test: no stopped rank left behind
        for proc in psutil.Process(launch.proc.pid).children(recursive=True):
            proc.kill()


def test_a_rank_killed_after_the_work_was_saved_leaves_the_job_complete(tmp_path: Path) -> None:
    """kill -9 of the stopped rank once rank 0 exited: the same verdict as a held rank."""
    launch, run_dir = held_launch(tmp_path, "train.hang_timeout=600")
    try:
        wait_for_phase(launch, run_dir / "heartbeats" / "rank0.json", "exit")
        rank_process(launch.proc.pid, 1).kill()
        code = launch.wait(timeout=120)
    finally:
        end_all(launch)
    output = launch.output
    assert code == COMPLETE_HELD, output
    assert "rank 1 (SIGKILL, exit -9, in evaluation) died after the run's work was complete" in (
        output
    ), output
    assert "died first" not in output and "Nothing to rerun" in output, output
    summary = read_summary(run_dir)
    assert (summary["status"], summary["exit_status"]) == ("completed", COMPLETE_HELD), summary
    assert summary["died_after_work"]["ranks"] == [1], summary


def test_one_sigterm_ends_a_job_whose_training_is_over(tmp_path: Path) -> None:
    """train.hang_timeout=0 (no watchdog clock): rank 1 stopped after the final save, rank 0
    exited. One SIGTERM (what `timeout` or `docker stop` sends) ends the job, without asking
    for a next step or a save."""
    launch, run_dir = held_launch(tmp_path, "train.hang_timeout=0")
    try:
        wait_for_phase(launch, run_dir / "heartbeats" / "rank0.json", "exit")
        launch.proc.send_signal(signal.SIGTERM)
        code = launch.wait(timeout=60)
    finally:
        end_all(launch)
    output = launch.output
    assert code == COMPLETE_HELD, output
    assert (
        "training is over on every rank (all past their last step and the final save)" in output
        and "complete and saved" in output
    ), output
    assert "after the current step" not in output, output
    assert "Nothing to rerun" in output, output


def test_a_rank_wedged_in_the_final_save_is_named_and_the_job_ends_hung(tmp_path: Path) -> None:
    """Rank 0 holds the final save before its completion record (debug.pause_save_at_step);
    rank 1 has written its part: rank 0 gets train.hang_timeout from then, is named with its
    stack, and the job ends HUNG (no final checkpoint), not at the process group's timeout."""
    run_dir = tmp_path / "run"
    args = [
        "train",
        "train.steps=2",
        "batch.global_size=8",
        *FAST,
        *DP2,
        f"train.hang_timeout={HELD_TIMEOUT}",
        "debug.pause_save_at_step=2",
    ]
    launch = Launch(args, run_dir)
    try:
        wait_for_phase(launch, run_dir / "heartbeats" / "rank1.json", "final save written")
        code = launch.wait(timeout=HELD_TIMEOUT + 60)
    finally:
        end_all(launch)
    output = launch.output
    assert code == HUNG, output
    assert "rank 0 on " in output and "in final save) still running" in output, output
    assert "after rank 1 finished its part of the final save" in output, output
    assert "the run's work is not complete (no final checkpoint)" in output, output
    assert "in __call__" in (run_dir / HANG_REPORT_FILE).read_text()  # the pause, on its stack


def test_a_held_rank_0_under_zero3_without_checkpoints_is_complete(tmp_path: Path) -> None:
    """Issue 43's held rank under ZeRO-3 (the DDP case: the test above; rank 1 here runs the
    end of the run alone), with two independent parts of the verdict in one run:
    checkpoint.enabled=false makes metrics.jsonl holding every step the work (never a claim that
    a rerun resumes from a checkpoint), and a held rank 0, whose summary.json has the figures,
    is said to leave no end-of-run evaluation or figures."""
    launch, run_dir = held_launch(
        tmp_path,
        "engine=deepspeed",
        "engine.zero_stage=3",
        f"train.hang_timeout={HELD_TIMEOUT}",
        "checkpoint.enabled=false",
        held=0,
    )
    try:
        wait_for_phase(launch, run_dir / "heartbeats" / "rank1.json", "exit")
        code = launch.wait(timeout=HELD_TIMEOUT + 30)  # from rank 1's exit
    finally:
        end_all(launch)
    output = launch.output
    assert code == COMPLETE_HELD, output
    assert "hang at the end of the run: rank 0 on " in output and "(stopped" in output, output
    assert "after rank 1 exited cleanly" in output, output
    assert "complete and saved (checkpoint.enabled=false" in output, output
    assert "resumes from the last complete checkpoint" not in output, output
    assert "Nothing to rerun (but rank 0 did not finish: no end-of-run evaluation" in output, output
    assert [m["step"] for m in read_metrics(run_dir)] == list(range(1, HELD_STEPS + 1))
    (hang,) = read_events(run_dir)
    assert (hang["ranks"], hang["after_exit_of"], hang["complete"]) == ([0], [1], True), hang
    summary = read_summary(run_dir)  # the agent's side wrote it, completed
    assert (summary["status"], summary["exit_status"]) == ("completed", COMPLETE_HELD), summary
