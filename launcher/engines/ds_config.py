"""The DeepSpeed JSON config, generated from RootConfig (never written by hand).

Pure logic, no deepspeed import: `launch plan` writes and shows it without loading DeepSpeed, and
the worker rebuilds the same dict from the same config.yaml, so the file is what the run uses.

The batch sizes always come from our batch arithmetic. `engine.extra` may add DeepSpeed keys; a
key that contradicts a value we derive is an error naming both keys, never a silent override.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from launcher.config.engine import Offload
from launcher.config.root import RootConfig
from launcher.config.train import Precision
from launcher.errors import ConfigError

# Derived ds_config paths and the config key each one comes from.
DERIVED_FROM = {
    "train_batch_size": "batch.global_size",
    "train_micro_batch_size_per_gpu": "batch.micro_size",
    "gradient_accumulation_steps": "batch.grad_accum",
    "gradient_clipping": "optim.grad_clip",
    "zero_optimization.stage": "engine.zero_stage",
    "bf16.enabled": "train.precision",
    "fp16.enabled": "train.precision",
    # We hand DeepSpeed torch's AdamW (no compiled ops needed, same numbers as ddp/fsdp).
    "zero_allow_untested_optimizer": "engine=deepspeed (torch AdamW as the client optimizer)",
    "zero_optimization.offload_optimizer.device": "engine.offload",
    "zero_optimization.offload_param.device": "engine.offload",
    "zero_force_ds_cpu_optimizer": "engine.offload (torch AdamW steps on the CPU)",
}

# Sections DeepSpeed would use to replace our AdamW and warmup-cosine schedule.
RESERVED = {
    "optimizer": "optim.* (AdamW built by launcher/engines/optim.py)",
    "scheduler": "optim.* (warmup + cosine schedule built by launcher/engines/optim.py)",
}

# fp16 dynamic loss scaling, with the same start and back-off as torch.amp.GradScaler.
FP16_LOSS_SCALING = {
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 2000,
    "hysteresis": 1,
    "min_loss_scale": 1,
}


def derived_config(cfg: RootConfig) -> dict[str, Any]:
    """The keys we own: batch split, clipping, ZeRO stage, precision."""
    split = cfg.split()
    precision = cfg.train.precision
    fp16: dict[str, Any] = {"enabled": precision == Precision.fp16}
    if precision == Precision.fp16:
        fp16.update(FP16_LOSS_SCALING)
    config: dict[str, Any] = {
        "train_batch_size": split.global_size,
        "train_micro_batch_size_per_gpu": split.micro_size,
        "gradient_accumulation_steps": split.grad_accum,
        "gradient_clipping": float(cfg.optim.grad_clip),
        "zero_optimization": {"stage": cfg.engine.zero_stage},
        "bf16": {"enabled": precision == Precision.bf16},
        "fp16": fp16,
        "zero_allow_untested_optimizer": True,
    }
    offload = cfg.engine.offload
    if offload != Offload.none:
        # ZeRO-Offload; our torch AdamW steps the CPU partition (DeepSpeedCPUAdam would need its
        # compiled op, and other numbers than the other engines').
        zero = config["zero_optimization"]
        zero["offload_optimizer"] = {"device": "cpu"}
        if offload == Offload.params:
            zero["offload_param"] = {"device": "cpu"}
        config["zero_force_ds_cpu_optimizer"] = False
    return config


def _merge(base: dict[str, Any], extra: dict[str, Any], path: str = "") -> None:
    """Add `extra` into `base` in place; a derived leaf may only be repeated, never changed."""
    for key, value in extra.items():
        dotted = f"{path}{key}"
        if not path and key in RESERVED:
            raise ConfigError(
                [f"engine.extra.{key}", RESERVED[key]],
                f"DeepSpeed's {key!r} section would replace ours, and the curves would no longer "
                "match the other engines.",
                f"drop engine.extra.{key}; set optim.* instead.",
            )
        current = base.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            _merge(current, value, dotted + ".")
            continue
        owner = DERIVED_FROM.get(dotted)
        if owner is None:  # a section holding derived keys (also one we leave out: offload)
            owner = next((v for k, v in DERIVED_FROM.items() if k.startswith(dotted + ".")), None)
        if owner is not None and value != current:
            raise ConfigError(
                [f"engine.extra.{dotted}", owner],
                f"engine.extra sets {dotted}={json.dumps(value)}, but {owner} gives "
                f"{json.dumps(current)}.",
                f"drop engine.extra.{dotted} and set {owner} instead.",
            )
        base[key] = copy.deepcopy(value)


def build_ds_config(cfg: RootConfig) -> dict[str, Any]:
    """The ds_config dict a DeepSpeed run uses: derived keys, plus engine.extra where it agrees."""
    config = derived_config(cfg)
    _merge(config, dict(cfg.engine.extra))
    return config


def ds_config_json(cfg: RootConfig) -> str:
    """ds_config.json's text: sorted keys, indent 2 (read by people, diffed against goldens)."""
    return json.dumps(build_ds_config(cfg), indent=2, sort_keys=True) + "\n"
