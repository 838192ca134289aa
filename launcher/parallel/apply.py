"""Tensor parallelism on a built model: the family's plan over the mesh's tp dimension, before
recompute, compile and the engine (torchtitan's order)."""

from __future__ import annotations

from torch import nn

from launcher.config.root import RootConfig
from launcher.distributed import DistContext
from launcher.errors import ConfigError
from launcher.models.gpt import GPT
from launcher.parallel.mesh import TP


def apply_tensor_parallel(cfg: RootConfig, model: nn.Module, ctx: DistContext) -> nn.Module:
    """The model split over the tp ranks; itself when parallel.tp=1."""
    if ctx.tp == 1:
        return model
    if not isinstance(model, GPT):  # the config refuses this first; a plain error, not a trace
        raise ConfigError(
            ["parallel.tp", "model"],
            f"parallel.tp={ctx.tp}: no tensor-parallel plan for {type(model).__name__}.",
            "set parallel.tp=1.",
        )
    from launcher.parallel.gpt_plan import parallelize_gpt

    return parallelize_gpt(model, ctx.mesh[TP], cfg.parallel.sequence_sharded)
