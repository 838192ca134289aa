"""A checkpoint's model weights in a plain model, in one process without a process group, whatever
engine and dp wrote it: the one reader behind `launch generate`, `launch serve` and `launch
export`. Each engine reads its own format (EngineSpec.read_weights, launcher/engines/); here the
names become the user's own and the load is strict."""

from __future__ import annotations

from collections.abc import Container

import torch
from torch import nn

from launcher.adapters.apply import frozen_names
from launcher.checkpoint.files import ENGINE_DIR, Checkpoint
from launcher.config.root import RootConfig
from launcher.engines import engine_spec, engine_spec_named
from launcher.errors import ConfigError, LauncherError
from launcher.models.names import plain_name

RUN_KEY = "RUN_DIR_OR_CHECKPOINT"
"""How errors name the run or checkpoint a command reads."""

OUTER_PREFIXES = ("model_optim.model.", "module.")
"""Around a whole model: a DCP state's key, DDP's and DeepSpeed's wrapper."""


def user_name(name: str, names: Container[str]) -> str:
    """The model's own name for a weight read as `name`."""
    if name in names:
        return name
    name = plain_name(name)
    for prefix in OUTER_PREFIXES:
        if name not in names and name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def load_strict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` into `model`: every weight of the model, no other. A weight tied to another
    (GPT's head is its embedding) may be given once, under either name. The frozen base of an
    adapter run is not in its checkpoints: its weights are the model's own already."""
    frozen = frozen_names(model)
    own = {k: v for k, v in model.state_dict(keep_vars=True).items() if k not in frozen}
    renamed = {user_name(name, own): value for name, value in state.items()}
    # A frozen weight a format keeps anyway (DeepSpeed's tied duplicates): the model has it.
    renamed = {name: value for name, value in renamed.items() if name not in frozen}
    unexpected = sorted(set(renamed) - set(own))
    given = {own[name].data_ptr() for name in renamed if name in own}
    missing = sorted(n for n in set(own) - set(renamed) if own[n].data_ptr() not in given)
    if missing or unexpected:
        raise KeyError(f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.load_state_dict(renamed, strict=False)


def adapted_model(cfg: RootConfig, checkpoint: Checkpoint) -> nn.Module:
    """An adapter run's model on the CPU: its base rebuilt as the run built it (the same seed,
    the same initial weights), the adapters (and adapter.train_modules) from `checkpoint`."""
    from launcher.models.adapted import (
        BASE_KEY,
        build_trained_model,
        check_recorded_base,
        with_recorded_base,
    )

    saved = checkpoint.meta.get(BASE_KEY)
    cfg = with_recorded_base(cfg, saved)
    check_recorded_base(saved, cfg, checkpoint.path)
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.manual_seed(cfg.train.seed)
        model = build_trained_model(cfg)
    load_weights(model, checkpoint, cfg)
    return model


def load_weights(model: nn.Module, checkpoint: Checkpoint, cfg: RootConfig) -> None:
    """Fill `model` (the plain model `cfg`, the run's config, builds, on the CPU) with the weights
    of `checkpoint`, read by the engine that wrote it. One ConfigError naming the checkpoint when
    it cannot be read or does not fit the model."""
    name = str(checkpoint.meta.get("engine", cfg.engine.name.value))
    spec = engine_spec_named(name) or engine_spec(cfg.engine.name)
    try:
        load_strict(model, spec.read_weights(checkpoint.path / ENGINE_DIR, model, cfg))
    except LauncherError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ConfigError(
            RUN_KEY,
            f"the checkpoint {checkpoint.path} could not be loaded ({type(exc).__name__}: "
            f"{first}).",
            "pass another checkpoint of the run (checkpoints/step_<N>).",
        ) from None
