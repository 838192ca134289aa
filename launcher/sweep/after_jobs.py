"""A sweep whose points are SLURM jobs `launch` did not wait for: its summary as one more job.

`launch train -m cluster=slurm ...` submits each point and returns; at the end of the multirun
the callback submits `launch sweep-summary SWEEP_DIR --jobs-ended` with
`--dependency=afterany:<the points' jobs>` (launcher/runners/slurm_dependent.py), so the summary
is complete once the jobs end, whether each succeeded or failed. `--jobs-ended` tells the summary
that every point's job has ended: a point whose job left no result failed, and gets an error.txt
that says so.
"""

from __future__ import annotations

from pathlib import Path

from launcher.config.cluster import ClusterConfig
from launcher.rundir import SWEEP_SUMMARY_JOB, read_slurm_job, slurm_logs
from launcher.runners.slurm_dependent import DependentJob, submit_dependent
from launcher.sweep.compare import Check
from launcher.sweep.job import rank_reasons, record_failure
from launcher.sweep.points import Status, find_points

JOBS_ENDED = "--jobs-ended"


def pending_job(run_dir: Path) -> str | None:
    """The id of the SLURM job submitted for this run directory without waiting; None when
    there is none (a local point, or cluster.wait=true)."""
    record = read_slurm_job(run_dir)
    if record is None or record.get("waited"):
        return None
    return str(record["job_id"])


def summary_job(sweep_dir: Path, job_ids: list[str], check: Check) -> DependentJob:
    """`launch sweep-summary SWEEP_DIR --jobs-ended` (with the sweep's own check) after the
    jobs, whatever their end."""
    args = ["sweep-summary", str(sweep_dir.resolve()), JOBS_ENDED]
    args += ["--tolerance", f"{check.tolerance:g}", "--steps", str(check.steps)]
    return DependentJob(
        name=SWEEP_SUMMARY_JOB,
        directory=sweep_dir,
        key="hydra.sweep.dir",
        launch_args=args,
        after=job_ids,
    )


def submit_summary_job(
    sweep_dir: Path, job_ids: list[str], check: Check, cluster: ClusterConfig
) -> tuple[str, Path]:
    """Write <sweep dir>/sweep_summary.sbatch and submit it: the job's id and its log."""
    job = summary_job(sweep_dir, job_ids, check)
    job_id = submit_dependent(job, cluster)
    return job_id, job.log_path(job_id)


def record_ended_jobs(sweep_dir: Path) -> list[str]:
    """Every point's job has ended: one that left neither a summary nor a stop record failed
    (killed at its time limit, a node lost, a rank crashed). Record why in its error.txt, so the
    summary lists it as failed; returns those points' names."""
    if not sweep_dir.is_dir():
        return []  # the summary names the missing directory
    failed = []
    for point in find_points(sweep_dir):
        if point.status not in (Status.planned, Status.incomplete):
            continue
        record = read_slurm_job(point.path)
        if record is None:
            continue  # not a SLURM job of this sweep (e.g. `launch plan -m`)
        job_id = str(record["job_id"])
        reason = f"SLURM job {job_id} ended without finishing the run"
        reason += rank_reasons(point.path) or _last_line(slurm_logs(point.path, job_id)[1])
        record_failure(point.path, reason)
        failed.append(point.name)
    return failed


def _last_line(log: Path) -> str:
    """ " (slurm-<job>.err: its last line not srun's own)", or where the log would be."""
    try:
        lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln]
    except OSError:
        return f" (no {log.name})"
    if not lines:
        return f" ({log.name} is empty)"
    # srun's own closing lines ("srun: error: n1: task 0: Exited ...", "srun: ... Terminating
    # StepId=...") say that a task ended, not why, and their order varies: the job's last line of
    # its own is the cause.
    own = [ln for ln in lines if not ln.startswith("srun: ")]
    return f" ({log.name}: {(own or lines)[-1].strip()})"
