"""LoRA through peft on any nn.Module, in place: the layers keep their names (peft puts the base
layer under `<layer>.base_layer` and the adapters under `<layer>.lora_A.default`/`lora_B`), the
base is frozen, the adapters and adapter.train_modules train. Applied after the model is built
and its initial weights are loaded, before recompute policies and the engine wrap it."""

from __future__ import annotations

from typing import Any

from torch import nn

from launcher.adapters.targets import Resolved, resolve
from launcher.config.adapter import AdapterConfig
from launcher.errors import ConfigError

ADAPTER_NAME = "default"
"""peft's name for the one adapter a run trains."""
INSTALL = "pip install 'launcher[lora]'"


def require_peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ConfigError(
            "adapter",
            "adapter=lora needs peft, which is not installed.",
            f"{INSTALL} (or pip install peft).",
        ) from None
    return peft


def lora_config(cfg: AdapterConfig, resolved: Resolved, **extra: Any) -> Any:
    peft = require_peft()
    return peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(resolved.targets),
        bias="none",
        **extra,
    )


def apply_adapter(model: nn.Module, cfg: AdapterConfig) -> Resolved:
    """Inject the adapters into `model`, freeze the rest; the layers and modules chosen."""
    resolved = resolve(model, cfg)
    peft = require_peft()
    peft.inject_adapter_in_model(lora_config(cfg, resolved), model, adapter_name=ADAPTER_NAME)
    trained = tuple(resolved.train_modules)
    # A tied parameter (the GPT's tok_emb.weight is head.weight) trains when any of its names
    # does: setting requires_grad name by name would let its last name (head) freeze it again.
    train_ids = {
        id(param)
        for name, param in model.named_parameters(remove_duplicate=False)
        if is_adapter_name(name) or any(name.startswith(m + ".") for m in trained)
    }
    for param in model.parameters():
        param.requires_grad_(id(param) in train_ids)
    return resolved


def is_adapter_name(name: str) -> bool:
    return ".lora_" in name or name.startswith("lora_")


def frozen_names(model: nn.Module) -> set[str]:
    """Every name (tied ones too) under which a frozen parameter appears."""
    return {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def has_frozen(model: nn.Module) -> bool:
    return any(not p.requires_grad for p in model.parameters())


def merge_adapters(model: nn.Module) -> nn.Module:
    """Fold each adapter into its base layer (W + B A * alpha/r) and put the base layer back in
    its place: the plain model with its own names, no peft left inside."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(model.named_modules()):
        if not isinstance(module, BaseTunerLayer):
            continue
        module.merge()
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, module.get_base_layer())
    for param in model.parameters():
        param.requires_grad_(True)
    return model
