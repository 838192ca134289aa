"""TensorBoard: event files under <run dir>/tensorboard (rank 0): every numeric value of each
metrics.jsonl line as a scalar at its optimizer step, the run's config as hparams, the summary's
numbers as `summary/...` scalars at the end. Files only: no server, no network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.config.root import RootConfig
from launcher.logs import get_logger
from launcher.rundir import TENSORBOARD_DIR
from launcher.tracking.params import numbers, run_params

log = get_logger("tracking")


def _hparam(value: Any) -> int | float | str | bool:
    if isinstance(value, bool | int | float | str):
        return value
    return "null" if value is None else str(value)


class TensorBoardRun:
    name = "tensorboard"

    def __init__(self, writer: Any, directory: Path) -> None:
        self.writer: Any = writer
        self.directory = directory
        self.step = 0

    @classmethod
    def start(cls, cfg: RootConfig, run_dir: Path, derived: dict[str, Any]) -> TensorBoardRun:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        directory = run_dir / TENSORBOARD_DIR
        writer: Any = SummaryWriter(log_dir=str(directory))
        params = {key: _hparam(v) for key, v in run_params(cfg, derived).items()}
        for summary in hparams(params, {"loss": 0.0}):  # experiment, session start and end
            writer.file_writer.add_summary(summary)
        writer.flush()
        log.info(f"tensorboard event files in {directory} (tensorboard --logdir {directory})")
        return cls(writer, directory)

    def log(self, line: dict[str, Any]) -> None:
        if self.writer is None:
            return
        self.step = int(line["step"])
        try:
            for key, value in numbers(line).items():
                self.writer.add_scalar(key, value, global_step=self.step)
            self.writer.flush()
        except Exception as exc:  # losing the dashboard must not lose the training run
            log.warning(f"tensorboard: logging failed ({exc}); metrics.jsonl continues.")
            self.writer = None

    def finish(self, summary: dict[str, Any] | None, exit_code: int = 0) -> None:
        if self.writer is None:
            return
        writer, self.writer = self.writer, None
        try:
            for key, value in numbers(summary or {}).items():
                writer.add_scalar(f"summary/{key}", value, global_step=self.step)
            writer.close()
        except Exception as exc:
            log.warning(f"tensorboard: closing failed ({exc}).")
