"""The Hydra callback that writes the summary when a `launch train -m` sweep ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from launcher.sweep.report import write_summary

        setup_logging(0)
        sweep_dir = Path(str(config.hydra.sweep.dir))
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
        report(f"sweep summary: {result.headline()}")
        log.info(f"wrote {sweep_dir}/sweep_summary.md, .csv and .png")
