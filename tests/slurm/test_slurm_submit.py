"""Submission: job ids, SLURM's own errors, no sbatch, and injection attempts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import run_launch
from tests.slurm.conftest import JOB, cluster_nodes, job_id, job_log

NO_SLURM_PATH = {"PATH": "/nonexistent"}  # `launch` runs as sys.executable; sbatch is not found


def queued_jobs() -> set[str]:
    proc = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True)
    return set(proc.stdout.split())


@pytest.mark.e2e
def test_plan_renders_without_sbatch_and_without_secrets(tmp_path: Path) -> None:
    sentinel = "sentinel-wandb-key-5f0c1e2d3a4b"
    proc = run_launch(
        ["plan", "cluster=slurm", "parallel.nodes=2", "parallel.dp=4", *JOB],
        tmp_path,
        env={"WANDB_API_KEY": sentinel, **NO_SLURM_PATH},
    )
    script = (tmp_path / "train.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in script and "RANKS_PER_NODE=2\n" in script
    assert script.rstrip() in proc.stdout  # plan shows the script byte for byte
    assert "sbatch --parsable" in proc.stdout and "nothing was started" in proc.stdout
    assert sentinel not in script  # sbatch passes the environment; the script never copies it


@pytest.mark.e2e
def test_train_without_sbatch_is_a_clear_error(tmp_path: Path) -> None:
    proc = run_launch(["train", "cluster=slurm", *JOB], tmp_path, env=NO_SLURM_PATH, check=False)
    assert proc.returncode == 2
    assert "sbatch is not on PATH" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("cluster.job_name='x$(touch {s})'", "cluster.job_name"),
        ("cluster.extra_directives=['--comment=x$(touch {s})']", "cluster.extra_directives[0]"),
    ],
)
def test_metacharacters_in_directives_are_refused(override: str, key: str, tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    run_dir = tmp_path / "run"
    cluster_up = cluster_nodes() > 0
    before = queued_jobs() if cluster_up else set()
    proc = run_launch(
        ["train", "cluster=slurm", override.format(s=sentinel), *JOB], run_dir, check=False
    )
    assert proc.returncode == 2 and key in proc.stdout + proc.stderr
    assert not sentinel.exists()
    assert not (run_dir / "train.sbatch").exists()
    if cluster_up:
        assert queued_jobs() <= before  # nothing was submitted


@pytest.mark.slurm
@pytest.mark.e2e
def test_quoted_value_does_not_run_in_a_real_job(slurm_nodes: int, tmp_path: Path) -> None:
    """A value that passes validation but holds shell syntax reaches the job verbatim."""
    sentinel = tmp_path / "pwned"
    python = f"/nonexistent/x$(touch {sentinel})/`touch {sentinel}`/python"
    proc = run_launch(
        ["train", "cluster=slurm", "cluster.wait=true", f"cluster.python='{python}'", *JOB],
        tmp_path / "run",
        check=False,
    )
    assert proc.returncode not in (0, 75)
    log = job_log(tmp_path / "run", job_id(proc.stdout + proc.stderr))
    assert "No such file" in log and "requeueing" not in log  # a failure is not requeued
    assert not sentinel.exists()


@pytest.mark.slurm
@pytest.mark.e2e
def test_sbatch_error_is_reported_in_slurms_words(slurm_nodes: int, tmp_path: Path) -> None:
    proc = run_launch(
        ["train", "cluster=slurm", "cluster.partition=no-such-partition", *JOB],
        tmp_path,
        check=False,
    )
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert "sbatch refused the job" in out and "partition" in out.lower()
    assert "Traceback" not in out
