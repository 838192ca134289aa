"""The plan-time check of a Hugging Face model under parallel.tp > 1: its family's own
`base_model_tp_plan` (transformers), and tp dividing what that plan splits."""

from __future__ import annotations

from typing import Any

from torch import nn

from launcher.errors import ConfigError

SPLIT_SIZES = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "hidden_size")
"""The config numbers a colwise/rowwise plan divides by tp (heads stay whole on a rank)."""


def family_plan(model: nn.Module) -> dict[str, str] | None:
    """The model's transformers base_model_tp_plan (module pattern -> colwise / rowwise)."""
    plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None)
    return dict(plan) if plan else None


def check_family_plan(model: nn.Module, tp: int) -> None:
    """A ConfigError naming parallel.tp when the family has no plan or tp does not divide a size
    it splits."""
    config: Any = getattr(model, "config", None)
    family = getattr(config, "model_type", type(model).__name__)
    plan = family_plan(model)
    if plan is None:
        raise ConfigError(
            ["parallel.tp", "model"],
            f"the {family} family has no tensor-parallel plan in transformers "
            "(config.base_model_tp_plan).",
            "set parallel.tp=1, or use a family that has one (llama, mistral, qwen2, ...).",
        )
    unknown = sorted(set(plan.values()) - {"colwise", "rowwise"})
    if unknown:
        raise ConfigError(
            ["parallel.tp", "model"],
            f"the {family} family's base_model_tp_plan uses {', '.join(unknown)}, which the "
            "launcher does not map yet (it maps colwise and rowwise).",
            "set parallel.tp=1.",
        )
    for key in SPLIT_SIZES:
        value = getattr(config, key, None)
        if isinstance(value, int) and value % tp:
            fits = next(t for t in range(tp - 1, 0, -1) if value % t == 0)
            raise ConfigError(
                ["parallel.tp", "model"],
                f"tp={tp} does not divide the model's {key}={value}.",
                f"set parallel.tp={fits}.",
            )
