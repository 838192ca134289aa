"""Registers the schema in Hydra's ConfigStore; conf/*.yaml extend it."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from launcher.config.root import RootConfig


def register_configs() -> None:
    ConfigStore.instance().store(name="base_config", node=RootConfig)
