"""Turning a composed DictConfig or a config.yaml into a validated RootConfig (once)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

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


def to_root_config(cfg: DictConfig | dict[str, Any]) -> RootConfig:
    """Validate every section and the combinations; raise ConfigError naming the key."""
    try:
        node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
        merged = OmegaConf.merge(OmegaConf.structured(RootConfig), node)
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


def to_yaml(cfg: RootConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_plain(cfg: RootConfig) -> dict[str, Any]:
    plain = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)
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
