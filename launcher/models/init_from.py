"""model.init_from: a new run starts from exported weights (`launch export`): the directory's
safetensors files (model.safetensors, or a transformers export's shards), loaded strictly into
the freshly built model under its own parameter names."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from launcher.errors import ConfigError

KEY = "model.init_from"


def weight_files(value: str) -> list[Path]:
    path = Path(value).expanduser()
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ConfigError(
            KEY,
            f"{value} holds no safetensors weights.",
            f"give the directory `launch export` wrote: {KEY}=RUN/export.",
        )
    return files


def _read(value: str, headers_only: bool) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    weights: dict[str, torch.Tensor] = {}
    for file in weight_files(value):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (not a dict)
                if headers_only:
                    shape = f.get_slice(key).get_shape()
                    weights[key] = torch.empty(shape, device="meta")
                else:
                    weights[key] = f.get_tensor(key)
    return weights


def check_initial_weights(model: nn.Module, value: str) -> None:
    """Names and shapes against the model (on the meta device): the plan's check, no weights
    read."""
    _match(model, _read(value, headers_only=True), value)


def load_initial_weights(model: nn.Module, value: str) -> None:
    weights = _match(model, _read(value, headers_only=False), value)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(weights[name].to(tensor.dtype))


def _match(
    model: nn.Module, weights: dict[str, torch.Tensor], value: str
) -> dict[str, torch.Tensor]:
    own = model.state_dict(keep_vars=True)  # tied weights: one Parameter under several names
    # A transformers export stores tied weights once (its own rule); they are one tensor here.
    tied: dict[int, list[str]] = {}
    for name, tensor in own.items():
        tied.setdefault(id(tensor), []).append(name)
    for names in tied.values():
        have = [n for n in names if n in weights]
        for name in names:
            if have and name not in weights:
                weights[name] = weights[have[0]]
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    if missing or unexpected:
        raise ConfigError(
            KEY,
            f"the weights in {value} are not this model's: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}.",
            "give the export of a run with the same model section (its model.yaml).",
        )
    for name, tensor in own.items():
        source = weights[name]
        if source.shape != tensor.shape:
            raise ConfigError(
                KEY,
                f"{name} has shape {tuple(source.shape)} in {value}, {tuple(tensor.shape)} "
                "in this model.",
                "give the export of a run with the same model section (its model.yaml).",
            )
    return weights
