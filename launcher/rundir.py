"""The name of every file in a run directory, in one place, and the small readers of the markers.

<run dir>/
    config.yaml          the resolved config (credentials redacted); every rank reads it
    plan.json            the plan `launch plan` printed
    ds_config.json       engine=deepspeed: the generated DeepSpeed config
    train.sbatch         cluster=slurm: the rendered batch script
    verify.sbatch        `launch verify cluster=slurm`: the script that certifies the split
    verify.json          `launch verify`, verify.first: the certificate (launcher/verify/)
    slurm-<job>.out/.err cluster=slurm: the job's output
    slurm_job.json       cluster=slurm: the job last submitted for this directory (its id, and
                         whether `launch` waited for it)
    metrics.jsonl        one line per optimizer step (appended across resumes)
    summary.json         the run's end
    stopped.json         a graceful stop: the step and checkpoint to resume from
    error_rank<r>.txt    a failed rank's traceback (several ranks)
    rank_failures.json   several ranks: which rank failed first, how, and the others (torchrun's
                         agent, launcher/runners/agent.py); rank_failures_<node>.json per SLURM node
    error.txt            a failed sweep point's error
    events.jsonl         one line per hang, restart or elastic change (launcher/events.py)
    hang_report.txt      a hang: the rank that stopped progressing, and every rank's stacks
    heartbeats/          train.hang_timeout: each rank's progress (rank<r>.json) and the file its
                         stacks are dumped into on SIGUSR2 (rank<r>.stacks)
    checkpoints/         training-state checkpoints (launcher/checkpoint/files.py)
    eval/                lm-evaluation-harness results: step_<N>.json per evaluated checkpoint,
                         step_<N>.log (an evaluation during training: its output), and
                         step_<N>.sbatch / slurm-<job>.out (cluster=slurm: its own job),
                         step_<N>.pending until that evaluation has read the checkpoint
    wandb/               wandb's files; wandb/run_id.txt keeps the run id across resumes
    .hydra/              Hydra's copies of the config and overrides
    .lock                held (flock) by the run using the directory, and names it
                         (launcher/lifetime.py); a second run into the directory is refused
    nodes.txt            cluster=torchrun: the command every node runs, and where each
                         rendezvous value came from
    .nodes_token         cluster=torchrun: node 0's token for this launch; every other node
                         checks that it reads the same (the directory is shared)
    .torchelastic/       torchrun's scratch while its agent runs (the ranks' error files); removed
                         at the end, so nothing is left in the system temp directory
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.userpath import refuse_link, replace_own

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.json"
DS_CONFIG_FILE = "ds_config.json"
SBATCH_FILE = "train.sbatch"
VERIFY_SBATCH_FILE = "verify.sbatch"
CERTIFICATE_FILE = "verify.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
STOPPED_FILE = "stopped.json"
ERROR_FILE = "error.txt"
SAVE_PAUSED_FILE = "save_paused.json"
"""Left by debug.pause_save_at_step (tests only) when the save it holds is paused."""
CHECKPOINTS_DIR = "checkpoints"
WANDB_DIR = "wandb"
WANDB_RUN_ID_FILE = "run_id.txt"
TENSORBOARD_DIR = "tensorboard"
"""TensorBoard event files (tracking.backends=[...,tensorboard])."""
MLFLOW_DB = "mlflow.db"
"""The MLflow store (SQLite, MLflow's local store) when tracking.mlflow_uri is null."""
MLFLOW_ARTIFACTS = "mlartifacts"
"""The MLflow experiment's artifact root beside MLFLOW_DB."""
MLFLOW_RUN_ID_FILE = "mlflow_run_id.txt"
"""The MLflow run id, kept so that a resumed run continues the same MLflow run."""
EVAL_DIR = "eval"
"""lm-evaluation-harness results (launcher/harness/)."""
HYDRA_DIR = ".hydra"
LOCK_FILE = ".lock"
NODES_TOKEN_FILE = ".nodes_token"
NODES_FILE = "nodes.txt"
AGENT_DIR = ".torchelastic"
RANK_FAILURES_FILE = "rank_failures.json"
EVENTS_FILE = "events.jsonl"
HANG_REPORT_FILE = "hang_report.txt"
HEARTBEATS_DIR = "heartbeats"
MULTIRUN_FILE = "multirun.yaml"
SWEEP_CSV, SWEEP_MD, SWEEP_PNG = "sweep_summary.csv", "sweep_summary.md", "sweep_summary.png"
SWEEP_SUMMARY_JOB = "sweep_summary"
"""In a sweep directory: the SLURM job that writes the summary once the points' jobs end
(sweep_summary.sbatch, its log sweep_summary-<job>.out)."""
SLURM_JOB_FILE = "slurm_job.json"

_RANK_ERROR_PREFIX = "error_rank"

OWN_FILES = (
    *(CONFIG_FILE, PLAN_FILE, DS_CONFIG_FILE, SBATCH_FILE, VERIFY_SBATCH_FILE, CERTIFICATE_FILE),
    *(METRICS_FILE, SUMMARY_FILE, STOPPED_FILE, ERROR_FILE, RANK_FAILURES_FILE, LOCK_FILE),
    *(SLURM_JOB_FILE, NODES_TOKEN_FILE, NODES_FILE),
    *(EVENTS_FILE, HANG_REPORT_FILE, MLFLOW_RUN_ID_FILE),
    f"{WANDB_DIR}/{WANDB_RUN_ID_FILE}",
)
"""The files the launcher writes into a run directory by these names (a link there is refused)."""

STARTED_MARKS = (METRICS_FILE, CHECKPOINTS_DIR)
"""Files whose presence means a run has started training in the directory."""


def slurm_logs(run_dir: Path, job_id: str = "%j") -> tuple[Path, Path]:
    """A SLURM job's stdout and stderr files (sbatch fills in %j)."""
    return run_dir / f"slurm-{job_id}.out", run_dir / f"slurm-{job_id}.err"


def dependent_files(directory: Path, name: str, job_id: str = "%j") -> tuple[Path, Path]:
    """A job run after others (launcher/runners/slurm_dependent.py): its script and its log (one
    file for stdout and stderr; sbatch fills in %j)."""
    return directory / f"{name}.sbatch", directory / f"{name}-{job_id}.out"


def write_slurm_job(run_dir: Path, job_id: str, waited: bool) -> None:
    """Record the job submitted for this run directory: a sweep's summary job runs after the
    points' jobs that `launch` did not wait for."""
    record = {"job_id": job_id, "waited": waited}
    replace_own(run_dir / SLURM_JOB_FILE, json.dumps(record) + "\n")


def read_slurm_job(run_dir: Path) -> dict[str, Any] | None:
    """The record of write_slurm_job; None when there is none (or it cannot be read)."""
    try:
        info = json.loads((run_dir / SLURM_JOB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not str(info.get("job_id", "")).isdigit():
        return None
    return info


def clear_slurm_job(run_dir: Path) -> None:
    (run_dir / SLURM_JOB_FILE).unlink(missing_ok=True)


def rank_failures_file(run_dir: Path, node: str | None = None) -> Path:
    """Where torchrun's agent records the failed ranks (one file per SLURM node)."""
    if node is None:
        return run_dir / RANK_FAILURES_FILE
    stem, suffix = RANK_FAILURES_FILE.rsplit(".", 1)
    return run_dir / f"{stem}_{node}.{suffix}"


def heartbeat_file(run_dir: Path, rank: int) -> Path:
    """A rank's progress record (launcher/worker/heartbeat.py)."""
    return run_dir / HEARTBEATS_DIR / f"rank{rank}.json"


def heartbeat_files(run_dir: Path) -> list[Path]:
    """Every rank's progress record there is (any node's: the run directory is shared)."""
    return sorted((run_dir / HEARTBEATS_DIR).glob("rank*.json"))


def stacks_file(run_dir: Path, rank: int) -> Path:
    """Where a rank's Python stacks go when it gets SIGUSR2 (faulthandler)."""
    return run_dir / HEARTBEATS_DIR / f"rank{rank}.stacks"


def rank_error_file(run_dir: Path, rank: int) -> Path:
    return run_dir / f"{_RANK_ERROR_PREFIX}{rank}.txt"


def rank_error_files(run_dir: Path) -> list[tuple[str, Path]]:
    """(rank, path) of every rank's error file, by rank."""
    found = [
        (path.stem.removeprefix(_RANK_ERROR_PREFIX), path)
        for path in run_dir.glob(f"{_RANK_ERROR_PREFIX}*.txt")
    ]
    return sorted(found, key=lambda item: int(item[0]) if item[0].isdigit() else -1)


PENDING_SUFFIX = ".pending"
"""eval/step_<N>.pending: an evaluation has not read that checkpoint yet (pruning skips it)."""


def harness_file(run_dir: Path, step: int, suffix: str = ".json") -> Path:
    """eval/step_<N>.json: the scores of the checkpoint of step N (.log, .sbatch: its job)."""
    return run_dir / EVAL_DIR / f"step_{step}{suffix}"


def check_own_files(run_dir: Path) -> None:
    """Before anything is written: one ConfigError for a symbolic link where the launcher writes a
    file of its own (launcher/userpath/own.py). A link to a directory is followed."""
    per_node = sorted(run_dir.glob(rank_failures_file(run_dir, "*").name))
    for path in [*(run_dir / name for name in OWN_FILES), *per_node]:
        refuse_link(path)
    for _, path in rank_error_files(run_dir):
        refuse_link(path)


def clear_rank_errors(run_dir: Path) -> None:
    for _, path in rank_error_files(run_dir):
        path.unlink(missing_ok=True)


# --- the stopped marker: how `launch` and restarted ranks learn that a stop was deliberate -------


def write_stopped(run_dir: Path, step: int, checkpoint: Path | None, reason: str | None) -> None:
    info = {"step": step, "checkpoint": str(checkpoint) if checkpoint else None, "signal": reason}
    replace_own(run_dir / STOPPED_FILE, json.dumps(info, indent=2) + "\n")


def read_stopped(run_dir: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((run_dir / STOPPED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def clear_stopped(run_dir: Path) -> None:
    (run_dir / STOPPED_FILE).unlink(missing_ok=True)


def stopped_words(run_dir: Path) -> str:
    """Where a graceful stop left the run, from stopped.json (rank 0's own line says it too)."""
    info = read_stopped(run_dir) or {}
    if "step" not in info:
        return "stopped on a signal"
    saved = f"saved {info['checkpoint']}" if info.get("checkpoint") else "nothing saved"
    return f"stopped after step {info['step']}, {saved}"
