"""The model a run trains: the base `model=...` builds (its initial weights loaded), with the
adapters of `adapter=...` applied (launcher/adapters/), and the identity of that base, which an
adapter checkpoint records and a resumed run must match (an adapter is only meaningful on the
weights it was trained beside)."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from launcher.adapters.apply import apply_adapter, frozen_names
from launcher.config.model import UserModelConfig
from launcher.config.root import RootConfig
from launcher.errors import ConfigError
from launcher.integrity.digests import weights_digest
from launcher.models.build import build_model
from launcher.models.init_from import load_initial_weights, weight_files
from launcher.models.names import plain_name

BASE_KEY = "base"
"""The checkpoint meta.json's record of the base weights (adapter runs)."""


def build_trained_model(cfg: RootConfig) -> nn.Module:
    """The base with its initial weights, adapters applied when adapter=lora (on the current
    default device; the caller seeds the RNG so every rank builds the same weights)."""
    model = build_model(cfg.model)  # the built-in GPT, or the user's own by `_target_`
    if cfg.model.init_from:  # a fine-tuning run: the exported weights, on every rank
        load_initial_weights(model, cfg.model.init_from)
    if cfg.adapter.enabled:
        apply_adapter(model, cfg.adapter)
    return model


def base_source(cfg: RootConfig) -> tuple[str, str | None]:
    """(the key that names the base, the path of its weights or None for a random init)."""
    if cfg.model.init_from:
        return "model.init_from", str(Path(cfg.model.init_from).expanduser().absolute())
    path = cfg.model.kwargs.get("path") if isinstance(cfg.model, UserModelConfig) else None
    if path:
        return "model.path", str(Path(str(path)).expanduser().absolute())
    return "train.seed", None


def with_recorded_base(cfg: RootConfig, saved: dict[str, Any] | None) -> RootConfig:
    """cfg with its base's path as the checkpoint recorded it (absolute): a run's config keeps
    model.init_from / model.path as typed, relative to where `launch train` ran, and `launch
    export`, `generate` and `serve` of the run may run from anywhere."""
    source = (saved or {}).get("source")
    key = (saved or {}).get("key")
    if not source or key not in ("model.init_from", "model.path"):
        return cfg
    if base_source(cfg)[0] != key:
        return cfg
    cfg = copy.deepcopy(cfg)
    if key == "model.init_from":
        cfg.model.init_from = str(source)
    elif isinstance(cfg.model, UserModelConfig):
        cfg.model.kwargs["path"] = str(source)
    return cfg


def check_recorded_base(saved: dict[str, Any] | None, cfg: RootConfig, checkpoint: Path) -> None:
    """`launch export`, `generate`, `serve`: the base files the checkpoint recorded must still
    hold the weights its adapters were trained on (cfg: with_recorded_base's)."""
    now = file_base_identity(cfg)
    if saved is None or now is None or saved.get("sha256") == now["sha256"]:
        return
    raise ConfigError(
        now["key"],
        f"the base {now['source']} has changed since checkpoint {checkpoint} was trained on it "
        f"(sha256 {str(saved.get('sha256'))[:12]} then, {str(now['sha256'])[:12]} now): the "
        "adapters mean nothing on other weights.",
        f"put the weights the run trained on back at {now['source']} (a re-export of the same "
        "checkpoint has the same weights), or use a run "
        "trained on the new base.",
    )


def _file_digest(path: str) -> str:
    source = Path(path)
    files = weight_files(path) if source.is_dir() and any(source.glob("*.safetensors")) else []
    if source.is_dir() and not files:
        files = sorted(source.glob("*.bin"))
    digest = hashlib.sha256()
    for file in sorted(files or [source]):  # safetensors by their tensors: a re-export is equal
        digest.update(f"{file.name}:{weights_digest(file)}\n".encode())
    return digest.hexdigest()


def _state_digest(model: nn.Module) -> str:
    """Over the frozen weights by their plain names: the same whatever recompute or compile
    wrapped (a resumed run may change ac)."""
    digest = hashlib.sha256()
    state = model.state_dict()
    for plain, name in sorted((plain_name(n), n) for n in frozen_names(model)):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(plain.encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def base_identity(cfg: RootConfig, model: nn.Module) -> dict[str, Any] | None:
    """Where the frozen base came from and a digest of it (of its weight files, or of the
    random-init weights themselves); None for a run without adapters. Call it on the built
    model, before an engine wraps it."""
    if not cfg.adapter.enabled:
        return None
    from_files = file_base_identity(cfg)
    if from_files is not None:
        return from_files
    key, _ = base_source(cfg)
    return {
        "key": key,
        "source": f"random init of train.seed={cfg.train.seed}",
        "sha256": _state_digest(model),
    }


def file_base_identity(cfg: RootConfig) -> dict[str, Any] | None:
    """base_identity of an adapter run whose base comes from weight files (model.init_from,
    model.path), from the config alone: `launch` checks it before any rank starts."""
    key, path = base_source(cfg)
    if not cfg.adapter.enabled or path is None:
        return None
    return {"key": key, "source": path, "sha256": _file_digest(path)}


def check_base(saved: dict[str, Any] | None, now: dict[str, Any] | None, checkpoint: Path) -> None:
    """A ConfigError naming the base when the checkpoint's adapters were trained on another."""
    if saved is None or now is None or saved.get("sha256") == now.get("sha256"):
        return
    raise ConfigError(
        now["key"],
        f"checkpoint {checkpoint} holds adapters trained on the base {saved.get('source')} "
        f"(sha256 {str(saved.get('sha256'))[:12]}), but this run's base is {now['source']} "
        f"(sha256 {str(now['sha256'])[:12]}): the adapters mean nothing on other weights.",
        f"resume with the base the checkpoint was trained on ({_restore(saved)}), or start a new "
        "run elsewhere (hydra.run.dir=...).",
    )


def _restore(saved: dict[str, Any]) -> str:
    if saved.get("key") == "train.seed":
        return f"the same model code and {str(saved.get('source')).split(' of ')[-1]}"
    return f"{saved.get('key')}={saved.get('source')}, unchanged"
