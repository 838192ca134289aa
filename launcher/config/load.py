"""Turning a composed DictConfig or a config.yaml into a validated RootConfig (once)."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from launcher.config.keywords import fields_to_keys, keys_to_fields
from launcher.config.model import ModelConfig, UserModelConfig, is_user_model, split_user_model
from launcher.config.root import RootConfig
from launcher.errors import ConfigError, LauncherError


def _unwrap(exc: BaseException) -> LauncherError | None:
    """OmegaConf wraps errors raised in __post_init__; find ours inside."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, LauncherError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _unknown_keys(node: Any, schema: type, prefix: str = "") -> list[str]:
    """Keys in `node` that `schema` (a dataclass) has no field for, e.g. a `+optim.lrr=0.1` typo."""
    types = typing.get_type_hints(schema)  # resolves the postponed annotations
    unknown = []
    for key in node:
        name = f"{prefix}{key}"
        if key not in types:
            unknown.append(name)
            continue
        field_type = types[key]
        sub = node[key]
        if key == "model" and schema is RootConfig:
            field_type = UserModelConfig if is_user_model(sub) else ModelConfig
            if field_type is UserModelConfig:
                continue  # a user model's own keys are its arguments
        if (
            isinstance(sub, (dict, DictConfig))
            and isinstance(field_type, type)
            and dataclasses.is_dataclass(field_type)
        ):
            unknown += _unknown_keys(sub, field_type, name + ".")
    return unknown


def to_root_config(cfg: DictConfig | dict[str, Any]) -> RootConfig:
    """Validate every section and the combinations; raise ConfigError naming the key."""
    try:
        node = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg.copy()
        keys_to_fields(node)  # checkpoint.async -> the field async_
        unknown = _unknown_keys(node, RootConfig)
        if unknown:
            raise ConfigError(
                unknown,
                "no such config key (a typo, or a key added with + that nothing reads).",
                "check the spelling against `launch train --cfg job`.",
            )
        model = node.get("model")
        rest = OmegaConf.masked_copy(node, [str(k) for k in node if k != "model"])
        merged = OmegaConf.merge(OmegaConf.structured(RootConfig), rest)
        if model is not None:
            merged.model = _model_node(model)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        ours = _unwrap(exc)
        if ours is not None:
            raise ours from None
        key = getattr(exc, "full_key", None) or "config"
        raise ConfigError(str(key), str(exc).splitlines()[0]) from None
    except LauncherError:
        raise
    except Exception as exc:  # a __post_init__ error that OmegaConf did not wrap
        ours = _unwrap(exc)
        if ours is not None:
            raise ours from None
        raise
    assert isinstance(obj, RootConfig)
    return obj


def _model_node(model: Any) -> DictConfig:
    """The model section, typed: the built-in GPT's schema, or a user model's (its own keys in
    kwargs)."""
    try:
        if not is_user_model(model):
            return OmegaConf.merge(OmegaConf.structured(ModelConfig), model)  # type: ignore[return-value]
        plain = (
            OmegaConf.to_container(model, resolve=True) if isinstance(model, DictConfig) else model
        )
        assert isinstance(plain, dict)
        fields = split_user_model({str(k): v for k, v in plain.items()})
        return OmegaConf.merge(OmegaConf.structured(UserModelConfig), fields)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        if _unwrap(exc) is not None:
            raise
        key = getattr(exc, "full_key", None)
        raise ConfigError(f"model.{key}" if key else "model", str(exc).splitlines()[0]) from None


def _node(cfg: RootConfig) -> DictConfig:
    """The config as OmegaConf sees it; a user model's section flat, as its YAML is written."""
    node = OmegaConf.structured(cfg)
    if isinstance(cfg.model, UserModelConfig):
        node.model = cfg.model.plain()
    fields_to_keys(node)
    return node


def to_yaml(cfg: RootConfig) -> str:
    return OmegaConf.to_yaml(_node(cfg))


def to_plain(cfg: RootConfig) -> dict[str, Any]:
    plain = OmegaConf.to_container(_node(cfg), resolve=True, enum_to_str=True)
    assert isinstance(plain, dict)
    return {str(k): v for k, v in plain.items()}


def load_config_file(path: str | Path) -> RootConfig:
    """Read a run directory's config.yaml (what workers and resumed runs start from)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            "config", f"no config file at {path}.", "pass the run directory's config.yaml."
        )
    return to_root_config(OmegaConf.load(path))  # type: ignore[arg-type]
