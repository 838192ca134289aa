"""An evaluation's scores in the trackers the run trained with (tracking.backends), at the
training step of the checkpoint, from the evaluating process (a separate one, or a SLURM job):

- wandb: the run's own id (wandb/run_id.txt) resumed, the scores logged against `step` (the
  run's x-axis); offline, this process's files sit beside training's under wandb/ and
  `wandb sync` uploads both into the one run;
- tensorboard: an event file of its own in <run dir>/tensorboard (TensorBoard reads them all);
- mlflow: the run id training recorded (mlflow_run_id.txt), metrics only (its status is
  training's).

A tracker that fails warns: eval/step_N.json and metrics.jsonl already hold the scores."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from launcher.config.root import RootConfig
from launcher.config.tracking import Backend
from launcher.logs import get_logger
from launcher.rundir import MLFLOW_RUN_ID_FILE, TENSORBOARD_DIR
from launcher.tracking.params import numbers

log = get_logger("eval")


def log_to_trackers(cfg: RootConfig, run_dir: Path, line: dict[str, Any]) -> None:
    step = int(line["step"])
    values = numbers(line)
    for name, send in (("wandb", _wandb), ("tensorboard", _tensorboard), ("mlflow", _mlflow)):
        try:
            send(cfg, run_dir, line, values, step)
        except Exception as exc:
            log.warning(f"{name}: the scores were not logged ({type(exc).__name__}: {exc}).")


def _wandb(
    cfg: RootConfig, run_dir: Path, line: dict[str, Any], values: dict[str, float], step: int
) -> None:
    from launcher.tracking.wandb_run import WandbRun, check_wandb, wandb_off

    if wandb_off(cfg):
        return
    run = WandbRun.start(check_wandb(cfg), run_dir, {})
    if run is not None:
        run.log(line)
        run.finish(None)


def _tensorboard(
    cfg: RootConfig, run_dir: Path, line: dict[str, Any], values: dict[str, float], step: int
) -> None:
    if not cfg.tracking.uses(Backend.tensorboard):
        return
    from torch.utils.tensorboard import SummaryWriter

    writer: Any = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), filename_suffix=".eval")
    for key, value in values.items():
        writer.add_scalar(key, value, global_step=step)
    writer.close()


def _mlflow(
    cfg: RootConfig, run_dir: Path, line: dict[str, Any], values: dict[str, float], step: int
) -> None:
    if not cfg.tracking.uses(Backend.mlflow):
        return
    id_file = run_dir / MLFLOW_RUN_ID_FILE
    if not id_file.is_file():
        log.warning(f"mlflow: no {MLFLOW_RUN_ID_FILE} in {run_dir}; the scores were not logged.")
        return
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from launcher.tracking.mlflow_run import tracking_uri

    client = MlflowClient(tracking_uri=tracking_uri(cfg, run_dir))
    now = int(time.time() * 1000)
    metrics = [Metric(key, value, now, step) for key, value in values.items()]
    client.log_batch(id_file.read_text(encoding="utf-8").strip(), metrics=metrics)
