"""A `launch` subcommand run as a small SLURM job once other jobs have ended.

A sweep's summary (`launch sweep-summary DIR`) runs after the points' jobs this way; any step that
must wait for training jobs (an evaluation) can too. The script is written beside the files it
concerns (`<directory>/<name>.sbatch`, through launcher/userpath), its log goes next to it
(`<name>-<job>.out`), every value in its body is shell-quoted, and the dependency
(`afterany:ID:ID`: run whether the jobs succeeded or failed) is an #SBATCH line, so the file says
what it waits for. Like train.sbatch it holds no credential: sbatch passes the submitting shell's
environment to the job.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from launcher.config.cluster import ClusterConfig, refuse_secrets
from launcher.config.sbatch import SbatchJob, sbatch_directives
from launcher.errors import EnvironmentProblem
from launcher.rundir import dependent_files
from launcher.userpath import replace_own

Condition = Literal["afterany", "afterok"]
"""afterany: run once the jobs ended, however; afterok: only if every one succeeded."""


@dataclass(frozen=True)
class DependentJob:
    """What to run, after which jobs, and where its files go."""

    name: str
    """The stem of its files (<directory>/<name>.sbatch, <name>-<job>.out) and of its job name."""
    directory: Path
    """Where the script and the log go (a directory the user named)."""
    key: str
    """The config key that names `directory`, for errors (e.g. hydra.sweep.dir)."""
    launch_args: list[str]
    """The `launch` command line after `launch` (e.g. ["sweep-summary", DIR])."""
    after: list[str]
    """The job ids to wait for."""
    condition: Condition = "afterany"
    time: str = "00:10:00"
    """Its time limit: a summary or a report takes seconds."""
    cpus: int = 1
    extra_directives: list[str] = field(default_factory=list)
    """More #SBATCH options (e.g. --gpus-per-node=1 for an evaluation)."""

    def __post_init__(self) -> None:
        if not self.after or not all(job.isdigit() for job in self.after):
            raise ValueError(f"job ids must be digits, got {self.after!r}")

    @property
    def dependency(self) -> str:
        return f"{self.condition}:" + ":".join(self.after)

    @property
    def script_path(self) -> Path:
        return dependent_files(self.directory.resolve(), self.name)[0]

    def log_path(self, job_id: str = "%j") -> Path:
        return dependent_files(self.directory.resolve(), self.name, job_id)[1]


def _directives(job: DependentJob, cluster: ClusterConfig) -> str:
    # The cluster's partition, account and qos (where this user may run), none of the training
    # job's size, memory or node features: one task, one node, a few minutes.
    return sbatch_directives(
        SbatchJob(
            name=f"{cluster.job_name}-{job.name}",
            time=job.time,
            output=job.log_path(),  # stderr too: one log
            log_key=job.key,
            size=("--nodes=1", "--ntasks=1", f"--cpus-per-task={job.cpus}"),
            node_resources=False,
            dependency=job.dependency,
            extra=tuple(job.extra_directives),
        ),
        cluster,
    )


def render_dependent(job: DependentJob, cluster: ClusterConfig) -> str:
    """The text of <directory>/<name>.sbatch."""
    python = cluster.python or sys.executable
    command = shlex.join([python, "-m", "launcher.cli", *job.launch_args])
    lines = [
        "#!/bin/bash",
        f"# Rendered by `launch`: runs `launch {job.launch_args[0]}` once job(s) "
        f"{', '.join(job.after)} ended ({job.condition}). Rerun by hand: {command}",
        _directives(job, cluster),
        "",
        "set -uo pipefail",
        "",
        "# --- set-up (cluster.setup)",
        *(cluster.setup or ["# (none)"]),
        "",
        f"exec {command}",
        "",
    ]
    script = "\n".join(lines)
    refuse_secrets(cluster, script, job.script_path.name)
    return script


def submit_dependent(job: DependentJob, cluster: ClusterConfig) -> str:
    """Write the script and submit it; the new job's id. EnvironmentProblem when sbatch is
    missing or refuses it (e.g. a job it waits for is no longer known)."""
    script = render_dependent(job, cluster)
    path = job.script_path
    replace_own(path, script, key=job.key, bits=0o755)
    if shutil.which("sbatch") is None:
        raise EnvironmentProblem(
            f"sbatch is not on PATH, so {path} was not submitted. Fix: submit it from a SLURM "
            f"login node: sbatch {shlex.quote(str(path))}"
        )
    proc = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    job_id = proc.stdout.strip().split(";")[0]  # --parsable: "id" or "id;cluster"
    if proc.returncode != 0 or not job_id.isdigit():
        words = proc.stderr.strip() or f"exit status {proc.returncode}"
        raise EnvironmentProblem(f"sbatch refused {path}: {words}")
    return job_id
