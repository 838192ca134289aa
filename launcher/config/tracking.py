"""Experiment trackers beside metrics.jsonl: wandb (its own section, `wandb.*`), TensorBoard and
MLflow (rank 0 only, each receiving the same metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from launcher.errors import ConfigError


class Backend(str, Enum):
    wandb = "wandb"
    tensorboard = "tensorboard"
    mlflow = "mlflow"


@dataclass
class TrackingConfig:
    """Which trackers receive the run's metrics and config (metrics.jsonl is always written)."""

    backends: list[Backend] = field(default_factory=lambda: [Backend.wandb])
    """Any of wandb, tensorboard, mlflow, e.g. [wandb,tensorboard]; [] for metrics.jsonl only.
    wandb follows wandb.mode (wandb.mode=disabled turns it off too); tensorboard writes event
    files under <run dir>/tensorboard; mlflow logs to tracking.mlflow_uri."""
    mlflow_uri: str | None = None
    """MLflow tracking URI (a server http://HOST:5000, a database sqlite:////PATH/mlflow.db);
    null: a local store in the run directory (<run dir>/mlflow.db, SQLite, MLflow's successor to
    its deprecated ./mlruns file store), no server or network needed."""
    mlflow_experiment: str = "launcher"
    """MLflow experiment the run belongs to (created when missing)."""
    required: bool = True
    """A tensorboard or mlflow failure (missing package, unreachable server) stops the run at
    start; false: warn and train without it."""

    def __post_init__(self) -> None:
        names = [Backend(b).value for b in self.backends]
        if len(set(names)) != len(names):
            raise ConfigError(
                "tracking.backends",
                f"names a backend twice: {names}.",
                "list each of wandb, tensorboard, mlflow once.",
            )
        if not self.mlflow_experiment.strip():
            raise ConfigError(
                "tracking.mlflow_experiment", "is empty.", "give the experiment a name."
            )

    def uses(self, backend: Backend) -> bool:
        return backend in self.backends
