"""train.max_restarts: a rank killed mid-run (SIGKILL, not an exception) is restarted by torchrun;
the job resumes from the newest checkpoint and ends with every step and the undisturbed losses."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_resume import (
    COMMON,
    DP2,
    SLOW,
    STEPS,
    Launch,
    last_per_step,
    rank_process,
    reference_run,
)
from tests.helpers import max_rel_diff, read_losses, read_summary

pytestmark = [pytest.mark.multiproc, pytest.mark.e2e]


def test_a_killed_rank_restarts_the_job_from_the_newest_checkpoint(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    reference = reference_run(tmp_path_factory)
    run_dir = tmp_path / "run"
    launch = Launch([*COMMON, *DP2, SLOW, "checkpoint.every=2", "train.max_restarts=1"], run_dir)
    launch.wait_for_step(5)
    rank_process(launch.proc.pid, 1).kill()
    code = launch.wait()
    output = launch.output
    assert code == 0, output
    assert f"resuming from {run_dir / 'checkpoints'}/step_" in output
    summary = read_summary(run_dir)
    assert summary["steps"] == STEPS
    assert summary["final_loss"] == pytest.approx(read_summary(reference)["final_loss"], rel=1e-6)
    assert max_rel_diff(last_per_step(run_dir), read_losses(reference)) < 1e-6
