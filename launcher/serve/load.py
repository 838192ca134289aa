"""A trained run's model, config and tokenizer, from its run directory or one of its checkpoints,
in one process without a process group, whatever engine and dp wrote the checkpoint (the weights
through launcher/checkpoint/weights.py, which asks the engine that wrote them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from launcher.adapters.apply import merge_adapters
from launcher.checkpoint.files import Checkpoint, find_checkpoints, inspect
from launcher.checkpoint.weights import RUN_KEY, adapted_model, load_weights
from launcher.config.load import load_config_file
from launcher.config.root import RootConfig
from launcher.errors import ConfigError
from launcher.models import build_model
from launcher.models.adapted import BASE_KEY, with_recorded_base
from launcher.rundir import CONFIG_FILE
from launcher.serve.codec import Codec, codec_for


@dataclass
class LoadedRun:
    cfg: RootConfig
    model: nn.Module
    codec: Codec
    checkpoint: Checkpoint


def find_checkpoint(argument: str) -> tuple[Path, Checkpoint]:
    """(run directory, the checkpoint to load): the newest complete one of a run directory, or
    the checkpoints/step_<N> directory given."""
    path = Path(argument).expanduser().resolve()
    if not path.exists():
        raise _missing(argument, path)
    if (path / CONFIG_FILE).is_file():
        found = find_checkpoints(path)
        if not found:
            raise ConfigError(
                RUN_KEY,
                f"{path} holds no complete checkpoint (checkpoints/step_<N>).",
                "train it with checkpoint.enabled=true (the default) to the end, or pass "
                "another run.",
            )
        return path, found[0]
    checkpoint = inspect(path)
    run_dir = path.parent.parent
    if isinstance(checkpoint, str) or not (run_dir / CONFIG_FILE).is_file():
        why = checkpoint if isinstance(checkpoint, str) else f"no {CONFIG_FILE} in {run_dir}"
        raise ConfigError(
            RUN_KEY,
            f"{path} is neither a run directory (with {CONFIG_FILE}) nor a complete checkpoint "
            f"of one ({why}).",
            "pass a run directory or its checkpoints/step_<N>.",
        )
    return run_dir, checkpoint


def _missing(argument: str, path: Path) -> ConfigError:
    """A path that does not exist; for a run's checkpoints/step_<N>, the steps the run has."""
    run_dir = path.parent.parent
    if path.parent.name == "checkpoints" and (run_dir / CONFIG_FILE).is_file():
        found = sorted(find_checkpoints(run_dir), key=lambda c: c.step)
        if found:
            names = ", ".join(c.path.name for c in found)
            return ConfigError(
                RUN_KEY,
                f"{argument} does not exist; the complete checkpoints of {run_dir} are {names}.",
                f"pass one of them, or the run directory {run_dir} for its newest.",
            )
    return ConfigError(RUN_KEY, f"{argument} does not exist.", "pass a run directory.")


def load_model(
    argument: str, device: torch.device, merge: bool = True
) -> tuple[RootConfig, nn.Module, Checkpoint]:
    """The run's config, its model (eval mode, fp32, on `device`) with the checkpoint's weights,
    and the checkpoint: what export needs, for any data source (token files have no tokenizer).
    An adapter run's adapters are merged into its base unless merge=False."""
    run_dir, checkpoint = find_checkpoint(argument)
    cfg = with_recorded_base(load_config_file(run_dir / CONFIG_FILE), checkpoint.meta.get(BASE_KEY))
    return cfg, _model_of(cfg, checkpoint, device, merge), checkpoint


def load_run(argument: str, device: torch.device) -> LoadedRun:
    """The model and tokenizer of a run's checkpoint (the tokenizer first: a run without one is
    refused before its weights are read)."""
    run_dir, checkpoint = find_checkpoint(argument)
    cfg = with_recorded_base(load_config_file(run_dir / CONFIG_FILE), checkpoint.meta.get(BASE_KEY))
    codec = codec_for(cfg.data)
    return LoadedRun(cfg, _model_of(cfg, checkpoint, device), codec, checkpoint)


def _model_of(
    cfg: RootConfig, checkpoint: Checkpoint, device: torch.device, merge: bool = True
) -> nn.Module:
    if cfg.adapter.enabled:  # the base and its adapters, merged in memory (docs/adapters.md)
        model = adapted_model(cfg, checkpoint)
        return (merge_adapters(model) if merge else model).float().to(device).eval()
    with torch.device("cpu"):
        model = build_model(cfg.model)
    load_weights(model, checkpoint, cfg)
    return model.float().to(device).eval()
