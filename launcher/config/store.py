"""Registers the schema in Hydra's ConfigStore; conf/*.yaml extend it."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from launcher.config.keywords import fields_to_keys
from launcher.config.root import RootConfig


def register_configs() -> None:
    node = OmegaConf.structured(RootConfig)
    # The model section stays open while Hydra composes: a group file is the built-in GPT's
    # shape or a user model's own keys (`_target_` and its arguments). It is typed afterwards,
    # by launcher.config.load, against ModelConfig or UserModelConfig.
    node.model = {}
    fields_to_keys(node)  # checkpoint.async: a Python keyword, the field is async_
    ConfigStore.instance().store(name="base_config", node=node)
