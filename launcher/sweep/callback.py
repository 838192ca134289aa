"""The Hydra callback that writes the summary when a `launch train -m` sweep ends, and, when the
points are SLURM jobs still to run, submits the job that writes it again once they have ended."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from launcher.errors import LauncherError
from launcher.logs import get_logger, setup_logging
from launcher.sweep.compare import DEFAULT_STEPS, DEFAULT_TOLERANCE, Check

log = get_logger("sweep")


class SweepSummaryCallback(Callback):
    """Registered in conf/config.yaml under hydra.callbacks; runs on the machine that ran
    `launch`."""

    def __init__(self, tolerance: float = DEFAULT_TOLERANCE, steps: int = DEFAULT_STEPS) -> None:
        self.check = Check(tolerance, steps)
        self.pending: list[tuple[Path, str]] = []
        """(run dir, job id) of each point submitted to SLURM without waiting, in job order."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.pending = []

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        from launcher.sweep.after_jobs import pending_job

        # A point that returned 0 started afresh (sweep/job.py start_point clears an older job
        # record), so a record in its directory now is this sweep's.
        if job_return.status != JobStatus.COMPLETED or job_return.return_value != 0:
            return
        run_dir = Path(str(config.hydra.runtime.output_dir))
        job_id = pending_job(run_dir)
        if job_id is not None:
            self.pending.append((run_dir, job_id))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        setup_logging(0)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        self._write_summary(sweep_dir)
        if self.pending:
            self._submit_summary_job(sweep_dir)

    def _write_summary(self, sweep_dir: Path) -> None:
        from launcher.sweep.report import write_summary

        try:
            result = write_summary(sweep_dir, self.check, key="hydra.sweep.dir")
        except LauncherError as exc:  # e.g. a summary file's name taken by a directory
            log.error(
                f"could not write the sweep summary: {exc} Then run `launch sweep-summary "
                f"{sweep_dir}`."
            )
            return
        except Exception as exc:  # the points' results are safe; never fail the sweep at its end
            log.error(
                f"could not write the sweep summary: {type(exc).__name__}: {exc}. "
                f"Fix: run `launch sweep-summary {sweep_dir}` once the cause is fixed."
            )
            return
        report = log.info if result.passed else log.warning
        when = f" (until {len(self.pending)} SLURM job(s) end)" if self.pending else ""
        report(f"sweep summary{when}: {result.headline()}")
        log.info(f"wrote {sweep_dir}/sweep_summary.md, .csv and .png")

    def _submit_summary_job(self, sweep_dir: Path) -> None:
        from launcher.config.load import load_config_file
        from launcher.rundir import CONFIG_FILE
        from launcher.sweep.after_jobs import submit_summary_job

        job_ids = [job_id for _, job_id in self.pending]
        try:
            # The first point's cluster.* (partition, account, python, set-up) runs the summary.
            cluster = load_config_file(self.pending[0][0] / CONFIG_FILE).cluster
            job_id, job_log = submit_summary_job(sweep_dir, job_ids, self.check, cluster)
        except Exception as exc:  # the points' jobs are submitted; never fail the sweep at its end
            why = str(exc) if isinstance(exc, LauncherError) else f"{type(exc).__name__}: {exc}."
            log.error(
                f"could not submit the sweep summary job: {why} Fix: once jobs "
                f"{','.join(job_ids)} have ended, run `launch sweep-summary {sweep_dir} "
                "--jobs-ended`."
            )
            return
        log.info(
            f"submitted sweep summary job {job_id}, after job(s) {','.join(job_ids)} (afterany); "
            f"log: {job_log}"
        )
