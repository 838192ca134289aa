"""Build the configured model: the built-in GPT, or the user's own by `_target_`."""

from __future__ import annotations

from torch import nn

from launcher.config.model import AnyModelConfig, UserModelConfig
from launcher.models.gpt import GPT
from launcher.models.user import instantiate_user_model


def build_model(cfg: AnyModelConfig) -> nn.Module:
    """The model on the current default device, its forward returning logits."""
    if isinstance(cfg, UserModelConfig):
        return instantiate_user_model(cfg)
    return GPT(cfg)
