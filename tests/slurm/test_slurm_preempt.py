"""Preemption on the real cluster: USR1 -> checkpoint -> requeue -> resume, and the requeue cap."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher.exit_codes import STOPPED_RESUMABLE
from tests.helpers import LAUNCH, REPO, max_rel_diff, read_metrics
from tests.slurm.conftest import JOB, STEPS, TRAIN_AND_WAIT, job_log, steps_logged, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


def preempt(job: str, run_dir: Path, after_step: int) -> None:
    """What SLURM does `cluster.signal_seconds` before the time limit: USR1 to the batch shell."""
    wait_for(lambda: steps_logged(run_dir) >= after_step, f"step {after_step} of job {job}")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)


def test_preempted_job_requeues_resumes_and_honours_the_cap(
    two_nodes: int, reference_losses: list[float], tmp_path: Path
) -> None:
    args = [
        *TRAIN_AND_WAIT,
        "cluster.max_requeues=1",
        "parallel.nodes=2",
        "parallel.dp=2",
        "wandb.mode=offline",  # the requeued job must continue the same wandb run
        *(arg for arg in JOB if not arg.startswith("wandb.mode=")),
    ]
    env_args = [*LAUNCH, *args, f"hydra.run.dir={tmp_path}"]
    # `launch` waits for the job (sbatch --wait) while this test plays the scheduler.
    launch = subprocess.Popen(
        env_args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for(
            lambda: (tmp_path / "train.sbatch").exists() and any(tmp_path.glob("slurm-*.out")),
            "the job to start",
        )
        job = next(tmp_path.glob("slurm-*.out")).stem.removeprefix("slurm-")
        preempt(job, tmp_path, after_step=2)  # first notice: checkpoint, requeue 1 of 1
        wait_for(
            lambda: "requeued 1 time(s)" in job_log(tmp_path, job), "the requeued run to start"
        )
        stopped_at = steps_logged(tmp_path)
        assert 2 <= stopped_at < STEPS, "the first run was not stopped early"
        preempt(job, tmp_path, after_step=stopped_at + 2)  # second notice: the cap is reached
        out, _ = launch.communicate(timeout=240)
    finally:
        if launch.poll() is None:
            launch.kill()
    log = job_log(tmp_path, job)
    assert launch.returncode == STOPPED_RESUMABLE, out + log
    assert "requeueing (requeue 1 of 1)" in log, log
    assert "cluster.max_requeues=1 reached, not requeued" in log, log
    assert steps_logged(tmp_path) < STEPS, "the second notice did not stop the job"
    assert list((tmp_path / "checkpoints").iterdir()), "no checkpoint was saved"

    # The requeued run resumed on the same trajectory, into the same wandb run. (Resubmitted
    # after the cap, the same command resumes as any rerun does; a requeued job finishing the run
    # on the uninterrupted losses: test_slurm_node_down.py.)
    metrics = read_metrics(tmp_path)
    steps = [m["step"] for m in metrics]
    assert steps == list(range(1, len(steps) + 1)), steps  # appended across two runs, no step twice
    losses = [m["loss"] for m in metrics]
    assert max_rel_diff(losses, reference_losses[: len(losses)]) < 1e-5
    run_id = (tmp_path / "wandb" / "run_id.txt").read_text().strip()
    starts = sorted(p.name for p in (tmp_path / "wandb").glob("offline-run-*"))
    assert len(starts) == 2 and all(name.endswith(run_id) for name in starts), starts
