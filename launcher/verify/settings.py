"""What `launch verify` runs: the configured split made comparable, its one-big-batch reference,
and the tolerances of the comparison.

Both runs take the user's config unchanged in everything that decides the numbers (model, data,
seed, optimizer, engine and recompute of the split) and change only what a comparison needs:
verify.steps optimizer steps, dropout off, the compared precision, and no side effects (no
checkpoint, no tracking, no evaluation, no restart).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.config.load import to_plain, to_root_config
from launcher.config.root import RootConfig
from launcher.config.verify import VerifyPrecision


@dataclass(frozen=True)
class Tolerance:
    """The largest relative gap a certified split may show, by precision."""

    precision: str
    loss: float
    """Per step: |loss - reference| / |reference| (also the gradient norm)."""
    grad: float
    """Per parameter tensor after step 1: ||g - g_ref|| / ||g_ref||."""


# fp32: the split sums the same products in another order; rounding moves the 7th digit
# (measured: gaps up to 1e-6 over the pairwise grid of docs/verify.md).
# bf16/fp16: both runs use the engine's mixed-precision recipe (the reference too, see
# reference_config), so the split changes only how products and micro-batch gradients are
# summed. Each micro-batch's gradient may be rounded to the reduced type (8 significand bits for
# bf16: 2^-8 = 3.9e-3; 11 for fp16: 4.9e-4) before it is accumulated, and a tensor whose entries
# cancel across micro-batches (a LayerNorm bias) loses more: measured up to 2e-2 (bf16) for
# correct splits with FSDP and DeepSpeed, while the per-micro-batch mean moves tensors by 1e-1.
# The bf16 bound sits between (5e-2, about 13 units of 2^-8); fp16 scales it by 2^-3. The loss
# bound is loose (correct splits: 1e-5; the per-micro-batch mean: 1e-4, caught by the
# gradients instead): certify in fp32 when exactness matters.
TOLERANCES = {
    "fp32": Tolerance("fp32", loss=1e-5, grad=1e-5),
    "bf16": Tolerance("bf16", loss=5e-3, grad=5e-2),
    "fp16": Tolerance("fp16", loss=1e-3, grad=6e-3),
}


def compared_precision(cfg: RootConfig) -> str:
    """fp32 unless verify.precision says otherwise (train: train.precision)."""
    if cfg.verify.precision == VerifyPrecision.train:
        return cfg.train.precision.value
    return cfg.verify.precision.value


def _with(cfg: RootConfig, **sections: dict[str, Any]) -> RootConfig:
    """A copy of cfg with some keys changed, validated like any config."""
    plain = to_plain(cfg)
    for name, values in sections.items():
        plain[name] = {**plain[name], **values}
    return to_root_config(plain)


def split_config(cfg: RootConfig) -> RootConfig:
    """The configured split as verify runs it: same split, engine, recompute and place; a few
    steps, dropout off, the compared precision, no side effects."""
    model: dict[str, Any] = {"dropout": 0.0} if hasattr(cfg.model, "dropout") else {}
    return _with(
        cfg,
        model=model,
        train={
            "steps": cfg.verify.steps,
            "precision": compared_precision(cfg),
            "resume": "never",
            "max_restarts": 0,
            "log_every": max(cfg.verify.steps, 1),
        },
        parallel={"min_nodes": None},  # the planned nodes: no restarts, so not elastic
        checkpoint={"enabled": False, "every": 0},
        eval={"every": 0},
        wandb={"mode": "disabled"},
        verify={"first": False},
    )


def reference_config(split_cfg: RootConfig, grad_accum: int = 1) -> RootConfig:
    """One process over the same global batch: dp=1 (tp=1, pp=1), `grad_accum` micro-batches (1:
    the whole global batch at once), no recompute, on this machine. In fp32 the plain engine
    (DDP on one rank: plain PyTorch); in bf16/fp16 the split's own engine, whose mixed-precision
    recipe (FSDP's policy, DeepSpeed's bf16 weights with fp32 master copies, autocast) is part of
    the numbers, not of the split."""
    global_size = split_cfg.split().global_size
    engine: dict[str, Any] = {"name": "ddp", "zero_stage": 0, "extra": {}}
    if split_cfg.train.precision.value != "fp32":
        engine = {"name": split_cfg.engine.name.value, "zero_stage": split_cfg.engine.zero_stage}
    return _with(
        split_cfg,
        parallel={
            "dp": 1,
            "nodes": 1,
            "tp": 1,
            "sequence_parallel": None,
            "pp": 1,
            "pp_stages_per_rank": None,
            "pp_split": None,
        },
        batch={"global_size": global_size, "micro_size": None, "grad_accum": grad_accum},
        engine=engine,
        ac={"policy": "none"},
        cluster={"name": "local"},
    )
