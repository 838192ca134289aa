"""Build a real Trainer in this process (or in a spawned gloo rank) and record its gradients."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from launcher.config import to_root_config
from launcher.config.root import RootConfig
from launcher.data import build_dataset
from launcher.data.sequence import TokenDataset
from launcher.distributed import DistContext, init_distributed, teardown_distributed
from launcher.engines import build_engine
from launcher.tracking.metrics import StepMetrics
from launcher.tracking.tracker import Tracker
from launcher.training.loop import Trainer
from launcher.training.loss import LossFn, token_exact_loss
from launcher.worker.run import build_model

SMALL_MODEL = {"n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 24, "dropout": 0.0}


def make_config(**sections: dict[str, Any]) -> RootConfig:
    base: dict[str, Any] = {
        "model": dict(SMALL_MODEL),
        "train": {"steps": 4},
        "wandb": {"mode": "disabled"},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return to_root_config(base)


def build_trainer(
    cfg: RootConfig,
    ctx: DistContext,
    run_dir: Path,
    dataset: TokenDataset | None = None,
    loss_fn: LossFn = token_exact_loss,
) -> Trainer:
    """A Trainer as the worker builds it; `loss_fn` installs the negative control directly."""
    model = build_model(cfg)
    engine = build_engine(cfg, model, ctx)
    data = (
        build_dataset(cfg.data, cfg.model.seq_len, cfg.train.seed) if dataset is None else dataset
    )
    tracker = Tracker(run_dir, cfg.train.steps, cfg.train.log_every, enabled=False)
    return Trainer(cfg, ctx, engine, data, tracker, loss_fn=loss_fn)


def record_losses(trainer: Trainer) -> list[float | None]:
    """The logged loss of every step this trainer runs from now on (None: skipped)."""
    losses: list[float | None] = []
    log_step = trainer.tracker.log_step

    def record(m: StepMetrics) -> None:
        losses.append(m.loss)
        log_step(m)

    trainer.tracker.log_step = record  # type: ignore[method-assign]
    return losses


def record_gradients(trainer: Trainer) -> list[torch.Tensor]:
    """Patch this trainer's engine so every step first copies the synchronised gradients."""
    seen: list[torch.Tensor] = []
    engine = trainer.engine
    original: Callable[[], torch.Tensor] = engine.step

    def step_and_record() -> torch.Tensor:
        grads = [
            p.grad.detach().clone().flatten()
            for p in engine.module.parameters()
            if p.grad is not None
        ]
        seen.append(torch.cat(grads))
        return original()

    engine.step = step_and_record  # type: ignore[method-assign]
    return seen


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def one_step_gradient(
    cfg: RootConfig, run_dir: Path, loss_fn: LossFn = token_exact_loss
) -> torch.Tensor:
    """The gradient of step 0 in this process (a one-rank in-process group)."""
    ctx = init_distributed("cpu")
    try:
        trainer = build_trainer(cfg, ctx, run_dir, loss_fn=loss_fn)
        grads = record_gradients(trainer)
        trainer.train_step(0)
        return grads[0]
    finally:
        teardown_distributed()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def join_group(rank: int, world: int, port: int) -> DistContext:
    """Inside a spawned process: the env:// rendezvous that torchrun would set up."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    return init_distributed("cpu")
