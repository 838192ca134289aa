"""train.hang_timeout: a rank stopped with SIGSTOP mid-run is named (rank, host, state) by the
watchdog beside torchrun's agent, the others' stacks show them waiting in their collective, and
the job ends with HUNG instead of waiting for the process group's timeout."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.events import read_events
from launcher.exit_codes import HUNG
from launcher.rundir import HANG_REPORT_FILE
from tests.e2e.test_resume import DP2, Launch, rank_process
from tests.helpers import FAST, read_summary

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
