"""A `launch` subcommand as a SLURM job after other jobs (the sweep's summary job): the rendered
script, its quoting and dependency, no secrets; what the summary makes of jobs that ended."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from launcher.config.cluster import ClusterConfig, ClusterKind
from launcher.errors import ConfigError
from launcher.rundir import write_slurm_job
from launcher.runners.slurm_dependent import DependentJob, render_dependent
from launcher.sweep.after_jobs import pending_job, summary_job
from launcher.sweep.command import summary_main
from launcher.sweep.compare import Check
from launcher.sweep.points import Status, find_points

ODD_PYTHON = "/opt/my env/$HOME/py'thon"  # a blank, a `$` and a quote: each must stay literal


def cluster(**fields: object) -> ClusterConfig:
    return ClusterConfig(name=ClusterKind.slurm, **fields)  # type: ignore[arg-type]


def exec_argv(script: str) -> list[str]:
    line = next(ln for ln in script.splitlines() if ln.startswith("exec "))
    return shlex.split(line.removeprefix("exec "))


def test_the_summary_job_runs_after_every_point_whatever_their_end(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    job = summary_job(sweep, ["101", "102"], Check(1e-4, 0))
    script = render_dependent(job, cluster(partition="debug", account="lab", time="02:00:00"))
    directives = [ln.removeprefix("#SBATCH ") for ln in script.splitlines() if "#SBATCH" in ln]
    assert "--dependency=afterany:101:102" in directives
    assert f"--output={sweep.resolve()}/sweep_summary-%j.out" in directives
    # Minimal resources on the cluster's partition and account, not the training job's size.
    assert {"--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--time=00:10:00"} <= set(directives)
    assert {"--partition=debug", "--account=lab", "--no-requeue"} <= set(directives)
    assert not any(d.startswith(("--gpus", "--mem", "--error")) for d in directives)
    assert job.script_path == sweep.resolve() / "sweep_summary.sbatch"
    assert exec_argv(script)[3:] == [
        "sweep-summary",
        str(sweep.resolve()),
        "--jobs-ended",
        "--tolerance",
        "0.0001",
        "--steps",
        "0",
    ]


def test_every_value_in_the_body_is_quoted(tmp_path: Path) -> None:
    job = DependentJob(
        name="report",
        directory=tmp_path,
        key="hydra.sweep.dir",
        launch_args=["sweep-summary", "a dir; rm -rf ~", "$(id)"],
        after=["7"],
        condition="afterok",
    )
    script = render_dependent(job, cluster(python=ODD_PYTHON, setup=["module load x"]))
    assert exec_argv(script) == [ODD_PYTHON, "-m", "launcher.cli", *job.launch_args]
    assert "--dependency=afterok:7" in script and "--kill-on-invalid-dep=yes" in script
    assert "\nmodule load x\n" in script  # cluster.setup runs first, as in train.sbatch
    path = tmp_path / "report.sbatch"
    path.write_text(script)
    # bash itself reads it: well formed, and `$(id)` stays an argument, never a command.
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    words = 'eval "set -- ${1#exec }"; printf "%s\\n" "$@"'
    shown = subprocess.run(
        ["bash", "-c", words, "_", script.splitlines()[-1]],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.splitlines() == exec_argv(script)


def test_no_secret_reaches_the_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel = "wandb-sentinel-0123456789abcdef"
    monkeypatch.setenv("WANDB_API_KEY", sentinel)
    script = render_dependent(summary_job(tmp_path, ["1"], Check()), cluster())
    assert sentinel not in script and "WANDB" not in script  # sbatch passes the environment
    typed = cluster(setup=["export HF_TOKEN=hf_0123456789abcdef"])
    with pytest.raises(ConfigError) as info:
        render_dependent(summary_job(tmp_path, ["1"], Check()), typed)
    assert info.value.keys == ["cluster.setup[0]"]
    assert "sweep_summary.sbatch" in str(info.value)


def test_a_sweep_dir_an_sbatch_line_cannot_hold_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        render_dependent(summary_job(tmp_path / "my sweep", ["1"], Check()), cluster())
    assert info.value.keys == ["hydra.sweep.dir"] and "Fix:" in str(info.value)


def test_only_jobs_launch_did_not_wait_for_are_pending(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_slurm_job(tmp_path / "a", "11", waited=False)
    write_slurm_job(tmp_path / "b", "12", waited=True)
    assert pending_job(tmp_path / "a") == "11"
    assert pending_job(tmp_path / "b") is None  # cluster.wait: it has ended, the summary has it
    assert pending_job(tmp_path) is None
    assert json.loads((tmp_path / "a" / "slurm_job.json").read_text()) == {
        "job_id": "11",
        "waited": False,
    }


def point(sweep: Path, name: str, job: str | None, files: dict[str, str]) -> Path:
    run_dir = sweep / name
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("train: {seed: 0}\n")
    for file, text in files.items():
        (run_dir / file).write_text(text)
    if job is not None:
        write_slurm_job(run_dir, job, waited=False)
    return run_dir


def test_a_job_that_ended_without_a_result_is_a_failed_point(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    metrics = json.dumps({"step": 1, "loss": 2.0, "tokens": 8}) + "\n"
    summary = json.dumps({"steps": 1, "final_loss": 2.0}) + "\n"
    point(sweep, "0", "21", {"metrics.jsonl": metrics, "summary.json": summary})
    point(sweep, "1", "22", {"slurm-22.err": "slurmstepd: error: *** JOB 22 CANCELLED ***\n"})
    point(sweep, "2", "23", {"metrics.jsonl": metrics, "error_rank1.txt": "ValueError: broke\n"})
    point(sweep, "3", None, {})  # no job record (`launch plan -m`): left as it is
    assert summary_main([str(sweep), "--jobs-ended"]) == 1  # a point failed
    status = {p.name: (p.status, p.error) for p in find_points(sweep)}
    assert status["0"] == (Status.ok, None)
    assert status["1"] == (
        Status.failed,
        "SLURM job 22 ended without finishing the run (slurm-22.err: slurmstepd: error: "
        "*** JOB 22 CANCELLED ***)",
    )
    assert status["2"] == (
        Status.failed,
        "SLURM job 23 ended without finishing the run (rank 1: ValueError: broke)",
    )
    assert status["3"] == (Status.planned, None)
    markdown = (sweep / "sweep_summary.md").read_text()
    assert "## Failed points" in markdown and "SLURM job 22 ended" in markdown
    # Without the flag (jobs may still be running) nothing is recorded.
    point(sweep, "4", "24", {})
    assert summary_main([str(sweep)]) == 1
    assert find_points(sweep)[-1].status == Status.planned


def test_a_failed_jobs_reason_is_its_own_last_line_not_sruns(tmp_path: Path) -> None:
    from launcher.sweep.after_jobs import _last_line

    log = tmp_path / "slurm-7.err"
    log.write_text(
        "bash: /x/no-python: No such file or directory\n"
        "srun: error: n1: task 0: Exited with exit code 127\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=7.0\n"
    )
    assert _last_line(log) == " (slurm-7.err: bash: /x/no-python: No such file or directory)"
    log.write_text("srun: error: n1: task 0: Exited with exit code 1\n")  # nothing else: kept
    assert _last_line(log) == " (slurm-7.err: srun: error: n1: task 0: Exited with exit code 1)"
