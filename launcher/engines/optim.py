"""AdamW and its warmup + cosine schedule, built from OptimConfig (shared by the engines)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from launcher.config.train import OptimConfig


def param_groups(params: Iterable[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """Decay matrices and embeddings; not biases or norm weights. Frozen parameters (an adapter
    run's base) are left out, and so is a group left empty (LoRA's adapters are all matrices):
    ZeRO-3 drops empty groups, and the schedule must see the groups the optimizer keeps."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    seen: set[int] = set()
    for _, p in params:
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        param_groups(model.named_parameters(), cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        foreach=False,
    )


def lr_factor(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Multiplier of optim.lr at optimizer step `step` (0-based): linear warmup, cosine decay."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    decay_steps = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine


def build_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, cfg: OptimConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, cfg)
    )
