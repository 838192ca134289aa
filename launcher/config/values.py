"""One override's value checked against its key's type before Hydra sees it: a wrong type, an
item of a list of sections (data.sources) or a value a key cannot take is one ConfigError naming
the key and an example that works (launcher/config/overrides.py checks the keys themselves)."""

from __future__ import annotations

from dataclasses import is_dataclass
from enum import Enum
from typing import Any

from omegaconf import (
    BooleanNode,
    DictConfig,
    EnumNode,
    FloatNode,
    IntegerNode,
    ListConfig,
    OmegaConf,
    StringNode,
)
from omegaconf.errors import OmegaConfBaseException

from launcher.config.schema import Key, schema_keys
from launcher.config.suggest import did_you_mean as _did_you_mean
from launcher.config.suggest import one_of as _one_of
from launcher.config.suggest import suggestions as _suggestions
from launcher.errors import ConfigError


def _example(key: Key) -> str:
    default = key.default
    if isinstance(default, Enum):
        default = default.value
    if default is None or isinstance(default, (list, dict)):
        return ""
    if isinstance(default, bool):
        default = str(default).lower()
    return f", e.g. {key.name}={default}"


def _type_error(key: Key, value: Any) -> ConfigError:
    """The problem and fix for a value OmegaConf would not accept for `key`."""
    shown = repr(value)
    tp = key.type
    if value is None:
        return ConfigError(key.name, "cannot be null.", f"give it a value{_example(key)}.")
    if isinstance(tp, type) and issubclass(tp, Enum):
        names = [m.value for m in tp]
        mean = _did_you_mean([f"{key.name}={n}" for n in _suggestions(str(value), names)])
        return ConfigError(key.name, f"unknown value {shown}.", _one_of(mean, names))
    if tp is bool:
        return ConfigError(
            key.name, f"{shown} is not true or false.", f"set {key.name}=true or {key.name}=false."
        )
    if tp is int:
        return ConfigError(
            key.name, f"{shown} is not a whole number.", f"give a whole number{_example(key)}."
        )
    if tp is float:
        return ConfigError(key.name, f"{shown} is not a number.", f"give a number{_example(key)}.")
    origin = getattr(tp, "__origin__", None)
    item = (getattr(tp, "__args__", None) or (None,))[0]
    if (
        origin is list
        and isinstance(value, list)
        and isinstance(item, type)
        and issubclass(item, Enum)
    ):
        names = [m.value for m in item]
        unknown = [v for v in value if v not in names]
        return ConfigError(
            key.name,
            f"unknown value {unknown[0]!r} in {shown}." if unknown else f"{shown}.",
            f"list any of {', '.join(names)}, e.g. {key.name}=[{names[0]}].",
        )
    if origin is list:
        return ConfigError(
            key.name,
            f"{shown} is not a list.",
            f"write {key.name}=[item1,item2] (quote the whole override for the shell).",
        )
    if origin is dict:
        return ConfigError(
            key.name,
            f"{shown} is not a mapping.",
            f"write {key.name}={{name: value}} or add one entry with +{key.name}.NAME=VALUE.",
        )
    return ConfigError(
        key.name, f"{shown} is not a single value.", f"give one value{_example(key)}."
    )


def _has_interpolation(value: Any) -> bool:
    return "${" in str(value)


def _check_item(name: str, element: Any, item: Any) -> None:
    """One `{...}` of a list of sections (data.sources[1]): a mapping of known keys, each of its
    type; the error names the item's key (data.sources[1].weight), not the whole list."""
    fields = schema_keys(element)
    shape = "{" + ",".join(f"{f}:..." for f in fields) + "}"
    if not isinstance(item, dict):
        raise ConfigError(name, f"{item!r} is not a mapping.", f"write it as {shape}.")
    for field, value in item.items():
        known = fields.get(str(field))
        if known is None:
            raise ConfigError(
                f"{name}.{field}", "no such key.", f"give only {', '.join(fields)} in {shape}."
            )
        check_value(Key(f"{name}.{field}", known.type, known.optional, None, ""), value)


def check_value(key: Key, value: Any) -> None:
    """Raise ConfigError when OmegaConf would refuse `value` for `key` (its type, or its enum)."""
    if _has_interpolation(value):
        return  # resolved later, checked by the dataclass
    tp = key.type
    try:
        if isinstance(tp, type) and issubclass(tp, Enum):
            EnumNode(tp, value, is_optional=key.optional)
        elif tp is bool:
            BooleanNode(value, is_optional=key.optional)
        elif tp is int:
            IntegerNode(value, is_optional=key.optional)
        elif tp is float:
            FloatNode(value, is_optional=key.optional)
        elif tp is str:
            StringNode(value, is_optional=key.optional)
        elif getattr(tp, "__origin__", None) is list:
            (element,) = getattr(tp, "__args__", (Any,))
            if is_dataclass(element) and isinstance(value, list):  # data.sources=[{...},...]
                for i, item in enumerate(value):
                    _check_item(f"{key.name}[{i}]", element, item)
                    OmegaConf.merge(OmegaConf.structured(element), item)
            else:
                ListConfig(value, element_type=element, is_optional=key.optional)
        elif getattr(tp, "__origin__", None) is dict:
            DictConfig(value, is_optional=key.optional)
    except (OmegaConfBaseException, ValueError, TypeError):
        raise _type_error(key, value) from None
