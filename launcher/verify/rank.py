"""One rank of a verified split: built exactly as training builds it (launcher/worker/run.py),
with dropout off, trained verify.steps steps; rank 0 records every step's loss and gradient norm,
every parameter's full gradient of step 1 and the batch-dependent layers' running statistics.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from launcher.config.root import RootConfig
from launcher.distributed import (
    DistContext,
    check_world_size,
    init_distributed,
    teardown_distributed,
)
from launcher.engines import build_engine
from launcher.engines.base import Engine, TorchOptimizerEngine
from launcher.logs import setup_logging
from launcher.parallel.mesh import with_mesh
from launcher.parallel.pipeline_split import optimizer_aliases
from launcher.rundir import rank_error_file
from launcher.secrets import redact
from launcher.tracking.metrics import StepMetrics
from launcher.tracking.tracker import Tracker
from launcher.training.loop import Trainer
from launcher.userpath import replace_own
from launcher.verify.grads import full_gradients, running_statistics
from launcher.verify.results import GRADS_FILE, STATS_FILE, write_steps
from launcher.worker.compile import compile_errors
from launcher.worker.debug import loss_function
from launcher.worker.run import build_data, build_model, seed_rank, warn_batch_dependent_layers


def switch_off_dropout(model: nn.Module) -> None:
    """Dropout modules, and the float rates models pass to functional dropout (attention
    dropout in transformers models, the built-in GPT's): all 0."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)


class StepRecorder(Tracker):
    """A tracker that writes nothing and keeps every step's metrics."""

    def __init__(self, run_dir: Path, steps: int) -> None:
        super().__init__(run_dir, steps, steps, enabled=False)
        self.steps: list[StepMetrics] = []

    def log_step(self, m: StepMetrics) -> None:
        super().log_step(m)
        self.steps.append(m)


class GradientCapture:
    """Around the engine's first optimizer step: gathers every full gradient first (collective),
    so that rank 0 holds step 1's gradients. A pipeline's are captured at its clipping, once its
    replicas' and its tied weight's gradients are summed, and gathered from every stage."""

    def __init__(self, engine: Engine, ctx: DistContext) -> None:
        self.engine, self.ctx = engine, ctx
        self.grads: dict[str, torch.Tensor] | None = None
        if isinstance(engine, TorchOptimizerEngine) and engine.pipeline is not None:
            self._clip: Callable[[], torch.Tensor] = engine.clip_gradients
            engine.clip_gradients = self._capture_then_clip  # type: ignore[method-assign]
            return
        self._step: Callable[[], torch.Tensor] = engine.step
        engine.step = self._capture_then_step  # type: ignore[method-assign]

    def _capture_then_step(self) -> torch.Tensor:
        if self.grads is None:
            self.grads = full_gradients(self.engine)
        return self._step()

    def _capture_then_clip(self) -> torch.Tensor:
        if self.grads is None:
            self.grads = pipeline_gradients(self.engine, self.ctx)
        return self._clip()


def pipeline_gradients(engine: Engine, ctx: DistContext) -> dict[str, torch.Tensor]:
    """Every stage's full gradients on rank 0 (collective): one data-parallel rank per stage
    sends its stage's, the tied head's copy left out (one process names the tensor once)."""
    aliases = optimizer_aliases(engine.module)
    mine = {k: v for k, v in full_gradients(engine).items() if k not in aliases}
    sent = mine if ctx.dp_rank == 0 and ctx.tp_rank == 0 else {}
    stages: list[Any] = [None] * ctx.world_size if ctx.is_main else []
    dist.gather_object(sent, stages if ctx.is_main else None, dst=0)
    return {k: v for stage in stages for k, v in (stage or {}).items()}


def verify_rank(cfg: RootConfig, out_dir: Path, ctx: DistContext) -> None:
    parallel = cfg.parallel
    check_world_size(ctx, parallel.dp, parallel.nodes, parallel.tp, parallel.pp)
    ctx = with_mesh(ctx, parallel.tp, cfg.replicas(), parallel.pp)  # as the worker builds it
    split = cfg.split()
    model = build_model(cfg, ctx)
    switch_off_dropout(model)
    if ctx.is_main:
        warn_batch_dependent_layers(model, split.micro_size, split.global_size)
    engine = build_engine(cfg, model, ctx)
    seed_rank(cfg, ctx.rank)
    data = build_data(cfg, model)
    recorder = StepRecorder(out_dir, cfg.train.steps)
    trainer = Trainer(cfg, ctx, engine, data.train, recorder, loss_fn=loss_function(cfg))
    capture = GradientCapture(engine, ctx)
    trainer.train()
    stats = running_statistics(engine.module)
    if ctx.is_main:
        torch.save(capture.grads or {}, out_dir / GRADS_FILE)
        torch.save(stats, out_dir / STATS_FILE)
        write_steps(out_dir, recorder.steps, split, ctx.world_size)


def run_verify_rank(cfg: RootConfig, out_dir: Path) -> int:
    """Everything one rank does; the process group is destroyed whatever happens."""
    ctx = init_distributed(cfg.train.device)
    setup_logging(ctx.rank)
    try:
        with compile_errors(cfg.train.compile):
            verify_rank(cfg, out_dir, ctx)
        return 0
    except BaseException:
        if ctx.world_size > 1:
            replace_own(rank_error_file(out_dir, ctx.rank), redact(traceback.format_exc()))
        raise
    finally:
        teardown_distributed()
