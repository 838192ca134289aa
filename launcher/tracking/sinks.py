"""The trackers beside wandb (tracking.backends): checked before anything starts, started on
rank 0, each given every metrics.jsonl line and the summary. A tracker that fails while the run
trains warns and stops; the run and metrics.jsonl go on."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Protocol

from launcher.config.root import RootConfig
from launcher.config.tracking import Backend
from launcher.errors import ConfigError
from launcher.logs import get_logger

log = get_logger("tracking")

INSTALL = "pip install 'launcher[tracking]'"
PACKAGES = {Backend.tensorboard: "tensorboard", Backend.mlflow: "mlflow"}
"""The package each backend needs (the `tracking` extra)."""


class Sink(Protocol):
    name: str

    def log(self, line: dict[str, Any]) -> None: ...

    def finish(self, summary: dict[str, Any] | None, exit_code: int = 0) -> None: ...


def _fail(cfg: RootConfig, backend: Backend, problem: str, fix: str) -> None:
    if cfg.tracking.required:
        raise ConfigError(["tracking.backends", "tracking.required"], problem, fix)
    log.warning(f"{problem} Training continues without {backend.value}.")


def check_trackers(cfg: RootConfig) -> RootConfig:
    """Before anything starts: each named backend's package imports. Returns cfg, without the
    backends that cannot work when tracking.required=false (so the ranks do not try again)."""
    kept = []
    for backend in cfg.tracking.backends:
        package = PACKAGES.get(backend)
        if package is None:
            kept.append(backend)
            continue
        try:
            importlib.import_module(package)
        except Exception as exc:  # a broken install raises anything, not only ImportError
            _fail(
                cfg,
                backend,
                f"tracking.backends names {backend.value}, but the {package!r} package cannot "
                f"be imported ({type(exc).__name__}: {exc}).",
                f"{INSTALL} (tensorboard, mlflow); or drop {backend.value} from tracking.backends.",
            )
            continue
        kept.append(backend)
    if kept == list(cfg.tracking.backends):
        return cfg
    return dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, backends=kept))


def start_sinks(cfg: RootConfig, run_dir: Path, derived: dict[str, Any]) -> list[Sink]:
    """Rank 0's trackers other than wandb (which WandbRun starts)."""
    sinks: list[Sink] = []
    for backend in cfg.tracking.backends:
        try:
            if backend == Backend.tensorboard:
                from launcher.tracking.tensorboard_run import TensorBoardRun

                sinks.append(TensorBoardRun.start(cfg, run_dir, derived))
            elif backend == Backend.mlflow:
                from launcher.tracking.mlflow_run import MlflowRun

                sinks.append(MlflowRun.start(cfg, run_dir, derived))
        except Exception as exc:
            _fail(
                cfg,
                backend,
                f"{backend.value} failed to start ({type(exc).__name__}: {exc}).",
                f"check the tracking.* settings; or drop {backend.value} from tracking.backends.",
            )
    return sinks
