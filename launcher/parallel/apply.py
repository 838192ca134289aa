"""Tensor parallelism on a built model: the family's plan over the mesh's tp dimension, before
recompute, compile and the engine (torchtitan's order). Under pipeline parallelism it splits a
rank's stages (cut first), each stage's blocks on that stage's tp sub-mesh."""

from __future__ import annotations

from torch import nn

from launcher.config.model import UserModelConfig
from launcher.config.root import RootConfig
from launcher.distributed import DistContext
from launcher.errors import ConfigError
from launcher.models.gpt import GPT
from launcher.models.tensor_parallel import family_plan
from launcher.parallel.mesh import TP
from launcher.parallel.pipeline_split import RankStages


def apply_tensor_parallel(cfg: RootConfig, model: nn.Module, ctx: DistContext) -> nn.Module:
    """The model split over the tp ranks; itself when parallel.tp=1."""
    if ctx.tp == 1:
        return model
    if isinstance(model, GPT | RankStages):  # a pipeline rank's stages: inside each stage
        from launcher.parallel.gpt_plan import parallelize_gpt

        return parallelize_gpt(model, ctx.mesh[TP], cfg.parallel.sequence_sharded)
    if isinstance(cfg.model, UserModelConfig) and cfg.model.tp_plan:  # the user's own plan
        from launcher.parallel.user_plan import parallelize_user

        return parallelize_user(model, ctx.mesh[TP], cfg.model.tp_plan)
    if family_plan(model) is not None:  # a Hugging Face family's own plan
        from launcher.parallel.hf_plan import parallelize_hf

        return parallelize_hf(model, ctx.mesh[TP])
    # The config and the plan refuse this first; a plain error here, never a traceback.
    raise ConfigError(
        ["parallel.tp", "model"],
        f"parallel.tp={ctx.tp}: no tensor-parallel plan for {type(model).__name__}.",
        "set parallel.tp=1, or name the layers to split in model.tp_plan.",
    )
