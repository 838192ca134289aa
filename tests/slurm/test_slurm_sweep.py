"""A SLURM sweep without cluster.wait completes its own summary: one more job, after the points'
jobs (afterany), runs `launch sweep-summary`, so nothing is run by hand."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import pytest

from launcher.config.cluster import ClusterConfig, ClusterKind
from launcher.errors import EnvironmentProblem
from launcher.runners.slurm_dependent import submit_dependent
from launcher.sweep.after_jobs import summary_job
from launcher.sweep.compare import Check
from tests.helpers import FAST, run_launch
from tests.slurm.conftest import job_finished, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


def test_a_sweep_of_slurm_jobs_writes_its_summary_when_they_end(
    slurm_nodes: int, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    args = [
        "train",
        "-m",
        "cluster=slurm",
        "batch.global_size=8",
        "batch.grad_accum=1,2",
        *FAST,
        "train.steps=6",
        "checkpoint.enabled=false",
        "cluster.time=00:10:00",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = run_launch(args)
    out = proc.stdout + proc.stderr
    assert out.count("submitted SLURM job") == 2, out  # `launch` returned without waiting
    points = re.findall(r"submitted SLURM job (\d+)", out)
    match = re.search(r"submitted sweep summary job (\d+), after job\(s\) (\S+) \(afterany\)", out)
    assert match, out
    summary_job, after = match.groups()
    assert after == ",".join(points)
    script = (sweep / "sweep_summary.sbatch").read_text()
    assert f"#SBATCH --dependency=afterany:{':'.join(points)}\n" in script
    log = sweep / f"sweep_summary-{summary_job}.out"
    wait_for(lambda: job_finished(summary_job) and log.is_file(), "the summary job", 300.0)
    with open(sweep / "sweep_summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["grad_accum"], r["status"], r["check"]) for r in rows] == [
        ("1", "ok", "reference"),
        ("2", "ok", "agrees"),
    ], log.read_text()
    assert all(r["common_steps"] == "6" for r in rows)
    markdown = (sweep / "sweep_summary.md").read_text()
    assert "2 point(s): 2 ok; 1 loss curve(s) compared with their reference, none differs" in (
        markdown
    )
    assert (sweep / "sweep_summary.png").is_file()
    assert "| grad_accum=2 |" in log.read_text()  # the job printed the table into its log


def test_the_summary_job_runs_after_a_failed_point_and_reports_it(
    slurm_nodes: int, tmp_path: Path
) -> None:
    # Point 1's job fails at once: its nodes have no such Python.
    sweep = tmp_path / "sweep"
    args = [
        "train",
        "-m",
        "cluster=slurm",
        f"cluster.python={sys.executable},{tmp_path}/no-python",
        "batch.global_size=8",
        "batch.grad_accum=2",
        *FAST,
        "train.steps=2",
        "checkpoint.enabled=false",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = run_launch(args)
    match = re.search(r"submitted sweep summary job (\d+)", proc.stdout + proc.stderr)
    assert match, proc.stdout + proc.stderr
    log = sweep / f"sweep_summary-{match.group(1)}.out"
    wait_for(lambda: job_finished(match.group(1)) and log.is_file(), "the summary job", 300.0)
    with open(sweep / "sweep_summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "failed"], log.read_text()
    assert re.match(r"SLURM job \d+ ended without finishing the run \(", rows[1]["note"])
    assert "no-python" in rows[1]["note"]  # the job's own error, from its slurm-<job>.err
    assert "1 failed" in (sweep / "sweep_summary.md").read_text()


def test_a_summary_job_sbatch_refuses_is_one_error_naming_the_script(
    slurm_nodes: int, tmp_path: Path
) -> None:
    job = summary_job(tmp_path, ["1"], Check())
    with pytest.raises(EnvironmentProblem, match=r"sbatch refused .*sweep_summary\.sbatch: .*"):
        submit_dependent(job, ClusterConfig(name=ClusterKind.slurm, partition="no_such_part"))
    assert (tmp_path / "sweep_summary.sbatch").is_file()  # written first: it can be read or rerun
