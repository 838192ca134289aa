"""The user's own model, built the way Hydra users expect: `hydra.utils.instantiate` of the
model section (`_target_` and its arguments), importable from the working directory and
PYTHONPATH. Every failure is a ConfigError naming `model._target_` and the fix."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from launcher.config.model import UserModelConfig
from launcher.errors import ConfigError
from launcher.models.output import return_logits
from launcher.user_code import locate

KEY = "model._target_"


def locate_target(path: str) -> Any:
    """The class or function `path` names, or a ConfigError saying why it does not import."""
    return locate(path, KEY)


def _accepts(target: Any, name: str) -> bool:
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def model_arguments(cfg: UserModelConfig, target: Any) -> dict[str, Any]:
    """The target's arguments: the section's own keys, and seq_len when the target takes it."""
    args = dict(cfg.kwargs)
    if "seq_len" not in args and _accepts(target, "seq_len"):
        args["seq_len"] = cfg.seq_len
    return args


def instantiate_user_model(cfg: UserModelConfig) -> nn.Module:
    """Build the model (on the current default device) and make its forward return logits."""
    from hydra.utils import instantiate

    target = locate_target(cfg._target_)
    args = model_arguments(cfg, target)
    try:
        model = instantiate({"_target_": cfg._target_, **args}, _convert_="all")
    except ConfigError:
        raise
    except Exception as exc:
        cause = exc.__cause__ or exc
        raise ConfigError(
            KEY,
            f"building {cfg._target_}({', '.join(args)}) failed: {type(cause).__name__}: "
            f"{str(cause).splitlines()[0] if str(cause) else ''}",
            "check the arguments the model takes: set one as model.NAME, add a new one as "
            "+model.NAME.",
        ) from None
    if not isinstance(model, nn.Module):
        raise ConfigError(
            KEY,
            f"{cfg._target_} returned {type(model).__name__}, not a torch.nn.Module.",
            "point model._target_ at an nn.Module class or a function that returns one.",
        )
    return return_logits(model)
