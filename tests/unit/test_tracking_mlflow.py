"""MLflow beside wandb: a run launched again into the same run directory (a resume, a requeue)
continues the same MLflow run, keeps its first parameter values (MLflow refuses changes) and
ends with the status of its end."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from launcher.config.root import RootConfig
from launcher.config.tracking import Backend, TrackingConfig
from launcher.exit_codes import STOPPED_RESUMABLE
from launcher.tracking.mlflow_run import MlflowRun, tracking_uri
from tests.installed import require

require("mlflow")


def test_a_resumed_run_continues_the_same_mlflow_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    cfg = RootConfig(tracking=TrackingConfig(backends=[Backend.mlflow]))
    first = MlflowRun.start(cfg, tmp_path, {"world_size": 1})
    first.log({"step": 1, "loss": 2.5, "tokens": 10})
    first.finish(None, STOPPED_RESUMABLE)
    client = MlflowClient(tracking_uri=tracking_uri(cfg, tmp_path))
    assert client.get_run(first.id).info.status == "KILLED"

    longer = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=99))
    second = MlflowRun.start(longer, tmp_path, {"world_size": 1})
    assert second.id == first.id
    second.log({"step": 2, "loss": 2.0, "tokens": 10})
    second.finish({"steps": 2, "final_loss": 2.0})
    run = client.get_run(first.id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.steps"] == str(cfg.train.steps)  # the first value kept
    history = client.get_metric_history(first.id, "loss")
    assert {m.step: m.value for m in history} == {1: 2.5, 2: 2.0}
    assert run.data.metrics["summary/final_loss"] == 2.0
    assert not (tmp_path / "mlruns").exists() and (tmp_path / "mlflow.db").is_file()
