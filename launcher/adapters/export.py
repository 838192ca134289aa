"""An adapter run's export as peft writes one (`launch export RUN`): adapter_config.json and
adapter_model.safetensors, which `PeftModel.from_pretrained(base, DIR)` loads onto the base the run
started from (`base_model_name_or_path`). Modules trained in full (adapter.train_modules) are
saved as peft's `modules_to_save`."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from launcher.adapters.apply import ADAPTER_NAME, is_adapter_name, lora_config
from launcher.adapters.targets import Resolved
from launcher.config.adapter import AdapterConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
"""peft's names start with its wrappers' (PeftModel.base_model.model is the user's model)."""


def adapted_layers(model: nn.Module) -> list[str]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [name for name, m in model.named_modules() if isinstance(m, BaseTunerLayer)]


def trained_modules(model: nn.Module) -> list[str]:
    """The modules whose own parameters train in full (adapter.train_modules, resolved)."""
    found: list[str] = []
    for name, param in model.named_parameters():
        if param.requires_grad and not is_adapter_name(name):
            module = name.rpartition(".")[0]
            if module not in found:
                found.append(module)
    return found


def tied_trained(model: nn.Module) -> list[str]:
    """Names of trained modules whose parameters also appear under a name outside them (the
    GPT's tok_emb.weight is head.weight): peft's modules_to_save copies the module and unties
    it, so an adapter directory would not give this model."""
    modules = trained_modules(model)
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    tied = []
    for module in modules:
        for param in model.get_submodule(module).parameters():
            if any(not n.startswith(module + ".") for n in names[id(param)]):
                tied.append(module)
                break
    return tied


def adapter_state(model: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The trained tensors under peft's saved names (no adapter name: peft adds it on load)."""
    state: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        saved = name.replace(f".{ADAPTER_NAME}.", ".") if is_adapter_name(name) else name
        value = param.detach().to("cpu")
        state[PREFIX + saved] = (value.to(dtype) if value.is_floating_point() else value).clone()
    return state


def write_adapter(
    model: nn.Module,
    cfg: AdapterConfig,
    base: str | None,
    directory: Path,
    dtype: torch.dtype,
    causal_lm: bool,
) -> None:
    """adapter_config.json and adapter_model.safetensors of `model` (adapters injected)."""
    from safetensors.torch import save_file

    modules = trained_modules(model)
    config = lora_config(
        cfg,
        Resolved(adapted_layers(model), modules),
        modules_to_save=modules or None,
        base_model_name_or_path=base,
        task_type="CAUSAL_LM" if causal_lm else None,
    )
    config.save_pretrained(str(directory))
    save_file(adapter_state(model, dtype), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
