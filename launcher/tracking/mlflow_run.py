"""MLflow (rank 0): one run in tracking.mlflow_experiment, at tracking.mlflow_uri (null: a local
store in the run directory, <run dir>/mlflow.db, SQLite: no server or network). Every numeric
value of each metrics.jsonl line as a metric at its optimizer step, the run's config as params
(credentials redacted), the summary's numbers as `summary/...` metrics, and the run's end as its
status. The run id is kept in <run dir>/mlflow_run_id.txt: a resumed run continues the same
MLflow run."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from launcher.config.root import RootConfig
from launcher.exit_codes import STOPPED_RESUMABLE
from launcher.logs import get_logger
from launcher.rundir import MLFLOW_ARTIFACTS, MLFLOW_DB, MLFLOW_RUN_ID_FILE
from launcher.tracking.params import numbers, run_params
from launcher.userpath.own import replace_own

log = get_logger("tracking")

PARAM_CHARS = 6000
"""MLflow's longest parameter value (2.x): longer values are cut."""
BATCH = 100
"""Params per log_batch call (MLflow's limit)."""


def tracking_uri(cfg: RootConfig, run_dir: Path) -> str:
    return cfg.tracking.mlflow_uri or f"sqlite:///{(run_dir / MLFLOW_DB).resolve()}"


def _quiet() -> None:
    """The local store's first use creates its tables: MLflow and alembic say so at INFO."""
    for name in ("mlflow.store.db.utils", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _existing(client: Any, path: Path) -> Any | None:
    """The MLflow run this run directory logged to before (a resume), if the store has it."""
    if not path.is_file():
        return None
    try:
        return client.get_run(path.read_text(encoding="utf-8").strip())
    except Exception:
        return None


class MlflowRun:
    name = "mlflow"

    def __init__(self, client: Any, run_id: str) -> None:
        self.client: Any = client
        self.id = run_id

    @classmethod
    def start(cls, cfg: RootConfig, run_dir: Path, derived: dict[str, Any]) -> MlflowRun:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = tracking_uri(cfg, run_dir)
        _quiet()
        client = MlflowClient(tracking_uri=uri)
        id_file = run_dir / MLFLOW_RUN_ID_FILE
        run = _existing(client, id_file)
        if run is None:
            name = cfg.tracking.mlflow_experiment
            found = client.get_experiment_by_name(name)
            if found is not None:
                experiment = found.experiment_id
            else:  # artifacts beside the local store, never in the working directory
                where = None if cfg.tracking.mlflow_uri else (run_dir / MLFLOW_ARTIFACTS).resolve()
                experiment = client.create_experiment(
                    name, artifact_location=where.as_uri() if where else None
                )
            run = client.create_run(experiment, run_name=run_dir.name)
            replace_own(id_file, run.info.run_id + "\n")  # never through a link
        else:
            client.update_run(run.info.run_id, status="RUNNING")
        run_id = run.info.run_id
        logged = run.data.params  # a resumed run keeps its first values (MLflow refuses changes)
        params = [
            Param(key, str(value)[:PARAM_CHARS])
            for key, value in run_params(cfg, derived).items()
            if key not in logged
        ]
        for start in range(0, len(params), BATCH):
            client.log_batch(run_id, params=params[start : start + BATCH])
        log.info(f"mlflow run {run_id} at {uri} (mlflow ui --backend-store-uri {uri})")
        return cls(client, run_id)

    def _metrics(self, client: Any, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        for start in range(0, len(metrics), 1000):
            client.log_batch(self.id, metrics=metrics[start : start + 1000])

    def log(self, line: dict[str, Any]) -> None:
        if self.client is None:
            return
        try:
            self._metrics(self.client, numbers(line), int(line["step"]))
        except Exception as exc:  # losing the dashboard must not lose the training run
            log.warning(f"mlflow: logging failed ({exc}); metrics.jsonl continues, mlflow stops.")
            self.client = None

    def finish(self, summary: dict[str, Any] | None, exit_code: int = 0) -> None:
        if self.client is None:
            return
        client, self.client = self.client, None
        try:
            if summary:
                values = {f"summary/{k}": v for k, v in numbers(summary).items()}
                self._metrics(client, values, int(summary.get("steps") or 0))
            status = "FINISHED" if exit_code == 0 else "FAILED"
            if exit_code == STOPPED_RESUMABLE:
                status = "KILLED"  # stopped, continued by the next launch
            client.set_terminated(self.id, status=status)
        except Exception as exc:
            log.warning(f"mlflow: ending the run failed ({exc}).")
