"""Config keys that are Python keywords, such as `checkpoint.async`.

A dataclass cannot have a field named `async`, so the field carries a trailing underscore
(`CheckpointConfig.async_`) while the config files, the command line, config.yaml and the help
use the key without it. The names are translated here, in one place, on the way in and out.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable

from omegaconf import DictConfig, Node, open_dict


def key_name(field: str) -> str:
    """The config key of a dataclass field: `async_` -> `async`."""
    bare = field[:-1]
    return bare if field.endswith("_") and keyword.iskeyword(bare) else field


def field_name(key: str) -> str:
    """The dataclass field of a config key: `async` -> `async_`."""
    return f"{key}_" if keyword.iskeyword(key) else key


def _rename(node: DictConfig, rename: Callable[[str], str], keep_node: bool) -> None:
    for key in list(node.keys()):
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _rename(child, rename, keep_node)
        new = rename(str(key))
        if new != key and isinstance(child, Node):
            with open_dict(node):
                node[new] = child if keep_node else child._value()
                del node[key]


def keys_to_fields(node: DictConfig, skip: tuple[str, ...] = ("model",)) -> None:
    """Rename, in place, keyword keys to their fields (`checkpoint.async` -> `async_`), outside
    `skip` (a user model's arguments are its own)."""
    for section in list(node.keys()):
        child = node._get_node(section)
        if str(section) not in skip and isinstance(child, DictConfig):
            _rename(child, field_name, keep_node=False)


def fields_to_keys(node: DictConfig, skip: tuple[str, ...] = ("model",)) -> None:
    """Rename, in place, fields to their keyword keys (`checkpoint.async_` -> `async`), keeping
    each value's typed node (a bool stays a bool for Hydra's overrides)."""
    for section in list(node.keys()):
        child = node._get_node(section)
        if str(section) not in skip and isinstance(child, DictConfig):
            _rename(child, key_name, keep_node=True)
