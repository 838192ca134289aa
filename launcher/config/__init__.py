"""Typed configuration: one dataclass per concern, validated where it is defined."""

from launcher.config.load import load_config_file, to_root_config
from launcher.config.root import RootConfig

__all__ = ["RootConfig", "load_config_file", "to_root_config"]
