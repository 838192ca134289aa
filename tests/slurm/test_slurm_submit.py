"""Submission: the planned script rendered once and submitted by the real sbatch, job ids, SLURM's
own errors, no sbatch, and injection attempts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from launcher import commands
from launcher.config.root import RootConfig
from launcher.exit_codes import FAILED
from launcher.runners import slurm as slurm_runner
from tests.goldens import compose_config
from tests.helpers import LAUNCH, REPO, read_summary, run_launch
from tests.slurm.conftest import JOB, TRAIN_AND_WAIT, cluster_nodes, job_id, job_log, wait_for

NO_SLURM_PATH = {"PATH": "/nonexistent"}  # `launch` runs as sys.executable; sbatch is not found


def queued_jobs(under: Path) -> set[str]:
    """The queue's jobs whose script is under this directory (other tests submit meanwhile)."""
    proc = subprocess.run(
        ["squeue", "-h", "-o", "%i %o"], capture_output=True, text=True, check=True
    )
    return {
        job
        for job, _, command in (line.partition(" ") for line in proc.stdout.splitlines())
        if command.startswith(str(under))
    }


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
    proc = run_launch(
        ["train", "cluster=slurm", override.format(s=sentinel), *JOB], run_dir, check=False
    )
    assert proc.returncode == 2 and key in proc.stdout + proc.stderr
    assert not sentinel.exists()
    assert not (run_dir / "train.sbatch").exists()
    if cluster_up:
        assert not queued_jobs(tmp_path)  # nothing was submitted


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


@pytest.mark.slurm
@pytest.mark.e2e
def test_train_submits_the_planned_script_once_and_leaves_the_lock_to_the_job(
    slurm_nodes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real renderer, the planned sbatch command line, the real cluster. `launch` releases
    the run directory's lock before it submits: the job's first node takes it (with the lock
    still held there, the job would fail and this exit status with it)."""
    renders: list[Path] = []
    render = slurm_runner.render_sbatch

    def counting_render(cfg: RootConfig, run_dir: Path, verify_only: bool = False) -> str:
        renders.append(run_dir)
        return render(cfg, run_dir, verify_only)

    monkeypatch.setattr(slurm_runner, "render_sbatch", counting_render)
    steps = 2
    job = [arg for arg in JOB if not arg.startswith("train.steps=")]
    cfg = compose_config(["cluster=slurm", "cluster.wait=true", f"train.steps={steps}", *job])
    run_dir = tmp_path / "run"
    assert commands.train_command(cfg, run_dir) == 0
    assert renders == [run_dir]
    planned = json.loads((run_dir / "plan.json").read_text())["command"]
    assert planned == ["sbatch", "--parsable", "--wait", str(run_dir.resolve() / "train.sbatch")]
    # --wait: the job had ended when `launch` returned; its log went where the script says.
    assert read_summary(run_dir)["steps"] == steps
    [log] = run_dir.glob("slurm-*.out")
    assert f"#SBATCH --output={log.parent}/slurm-%j.out" in (run_dir / "train.sbatch").read_text()


@pytest.mark.slurm
@pytest.mark.e2e
def test_a_job_cancelled_before_it_starts_is_not_reported_as_success(
    slurm_nodes: int, tmp_path: Path
) -> None:
    """sbatch --wait exits 0 for a job cancelled while it waited; `launch` asks SLURM instead."""
    run_dir = tmp_path / "run"
    launch = subprocess.Popen(
        [
            *LAUNCH,
            *TRAIN_AND_WAIT,
            "cluster.extra_directives=[--hold]",
            *JOB,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: (run_dir / "slurm_job.json").exists(), "the job to be submitted")
        job = json.loads((run_dir / "slurm_job.json").read_text())["job_id"]
        subprocess.run(["scancel", str(job)], check=True)
        out, _ = launch.communicate(timeout=60)
    finally:
        if launch.poll() is None:
            launch.kill()
            if (run_dir / "slurm_job.json").exists():  # never leave a held job in the queue
                subprocess.run(
                    ["scancel", str(json.loads((run_dir / "slurm_job.json").read_text())["job_id"])]
                )
    assert launch.returncode == FAILED, out
    assert f"job {job} ended CANCELLED before it finished the run" in out, out
    assert "Fix: resubmit with sbatch" in out, out
