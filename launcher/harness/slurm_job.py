"""cluster=slurm: a checkpoint's evaluation as a job of its own (one node, one task, its own
time limit), submitted by training's rank 0 once the checkpoint is complete, so that the
training's ranks never wait for it. The script is <run dir>/eval/step_N.sbatch; its log is
eval/slurm-<job>.out. Every value in the script body is shell-quoted; the #SBATCH lines are
written and checked by launcher/config/sbatch.py; no credential is written (sbatch passes the
submitting environment to the job)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from launcher.config.cluster import refuse_secrets
from launcher.config.root import RootConfig
from launcher.config.sbatch import SbatchJob, sbatch_directives
from launcher.rundir import EVAL_DIR, harness_file
from launcher.userpath import replace_own


class SubmitFailed(RuntimeError):
    """sbatch refused the evaluation job or could not run (a credential in the script is
    refuse_secrets' ConfigError, reported the same way: training goes on)."""


def _directives(cfg: RootConfig, run_dir: Path, step: int) -> str:
    """One node, one task, one GPU on a GPU cluster, the node's CPUs and memory as training's."""
    cluster = cfg.cluster
    logs = run_dir / EVAL_DIR
    size = [
        "--nodes=1",
        "--ntasks=1",
        "--gpus-per-node=1" if cluster.gpus_per_node else None,
        f"--cpus-per-task={cluster.cpus_per_task}" if cluster.cpus_per_task else None,
    ]
    job = SbatchJob(
        name=f"{cluster.job_name}-eval-{step}",
        time=cfg.eval.harness.time,
        output=logs / "slurm-%j.out",
        error=logs / "slurm-%j.err",
        log_key="hydra.run.dir",
        size=tuple(option for option in size if option is not None),
    )
    return sbatch_directives(job, cluster)


def render_eval_sbatch(cfg: RootConfig, run_dir: Path, step: int, argv: list[str]) -> str:
    """The job's script; argv: `launch eval`'s arguments (checkpoint, overrides)."""
    python = cfg.cluster.python or sys.executable
    command = " ".join(shlex.quote(a) for a in [python, "-m", "launcher.cli", "eval", *argv])
    script = "\n".join(
        [
            "#!/bin/bash",
            f"# Rendered by `launch` (eval.harness.every): lm-evaluation-harness on the checkpoint "
            f"of step {step}, scores in eval/step_{step}.json.",
            _directives(cfg, run_dir, step),
            "set -uo pipefail",
            "",
            "# --- set-up (cluster.setup)",
            *(cfg.cluster.setup or ["# (none)"]),
            "",
            "export PYTHONUNBUFFERED=1",
            f"exec {command}",
            "",
        ]
    )
    refuse_secrets(cfg.cluster, script, f"{EVAL_DIR}/step_{step}.sbatch")
    return script


def submit_eval_job(
    cfg: RootConfig, run_dir: Path, step: int, argv: list[str], env: dict[str, str]
) -> str:
    """Write eval/step_N.sbatch and submit it; the job id."""
    path = harness_file(run_dir.resolve(), step, ".sbatch")
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_own(path, render_eval_sbatch(cfg, run_dir.resolve(), step, argv), bits=0o755)
    try:
        proc = subprocess.run(
            ["sbatch", "--parsable", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SubmitFailed(f"sbatch could not run ({exc})") from None
    job = proc.stdout.strip().split(";")[0]
    if proc.returncode or not job:
        raise SubmitFailed(f"sbatch refused {path}: {proc.stderr.strip() or proc.returncode}")
    return job
