"""The model's shape as one tensor-parallel rank holds it, for the memory plan: the split layers
divided by tp, what the plan keeps whole (norms, row-parallel biases; without sequence
parallelism the position embedding too) counted whole."""

from __future__ import annotations

import dataclasses

from launcher.config.model import ModelConfig
from launcher.config.root import RootConfig
from launcher.models.shape import ModelShape
from launcher.models.tp_plan import TpShare


def replicated(cfg: RootConfig) -> tuple[int, int]:
    """(elements kept whole on every tp rank in one block, in the rest of the model)."""
    model = cfg.model
    if not isinstance(model, ModelConfig):
        return 0, 0
    d = model.d_model
    block = 2 * 2 * d + 2 * d  # two LayerNorms (weight, bias); attn.proj and mlp.proj biases
    root = 2 * d + (0 if cfg.parallel.sequence_sharded else model.seq_len * d)  # ln_f, pos_emb
    return block, root


def per_tp_rank(cfg: RootConfig, shape: ModelShape, share: TpShare | None = None) -> ModelShape:
    """`shape` as one rank of a tensor-parallel group holds it; itself at tp=1. `share`: each
    parameter's elements on one rank under model.tp_plan (launcher/models/tp_plan.py)."""
    tp = cfg.parallel.tp
    if tp > 1 and share is not None:  # adapters are refused under tp: every parameter trains
        return dataclasses.replace(
            shape,
            parameters=sum(share.sizes),
            block_parameters=share.block,
            largest_parameter=max(share.sizes, default=0),
            parameter_sizes=share.sizes,
        )
    if tp == 1 or not isinstance(cfg.model, ModelConfig):
        return shape  # a family's own plan: counted whole (an upper bound)
    block_whole, root_whole = replicated(cfg)
    whole = shape.n_blocks * block_whole + root_whole

    def split(n: int, kept: int) -> int:
        return (n - kept) // tp + kept

    return dataclasses.replace(
        shape,
        parameters=split(shape.parameters, whole),
        block_parameters=split(shape.block_parameters, block_whole),
        largest_parameter=-(-shape.largest_parameter // tp),
        parameter_sizes=tuple(-(-n // tp) for n in shape.parameter_sizes),
        trainable=None if shape.trainable is None else split(shape.trainable, whole),
        block_trainable=(
            None if shape.block_trainable is None else split(shape.block_trainable, block_whole)
        ),
    )


def activation_divisor(cfg: RootConfig) -> int:
    """What one rank's activations (of one micro-batch through the whole model) are divided by:
    tp with sequence parallelism (every activation is sharded, on the heads, the hidden width or
    the sequence), else 1 (the norms' and the residual stream's are whole: counted whole, an
    upper bound). A pipeline rank's share is planned per stage (launcher/memory/stages.py)."""
    return cfg.parallel.tp if cfg.parallel.sequence_sharded else 1
