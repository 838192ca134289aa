"""Hugging Face transformers causal LMs (the optional extra `launcher[hf]`), the target of
conf/model/hf.yaml: `model.path=DIR` loads a local checkpoint (from_pretrained, safetensors,
nothing downloaded), `model.config=DIR_OR_JSON` builds one with random weights from its config.

transformers is imported only here, only when a run uses it. On the meta device (the plan's
probe) a checkpoint is built from its config alone: no weights are read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from launcher.errors import ConfigError

INSTALL = "pip install 'launcher[hf]'"
FROM_CONFIG_ARGS = ("dtype", "torch_dtype", "attn_implementation", "trust_remote_code")


def require_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            "model",
            "model=hf needs the Hugging Face extra (transformers, tokenizers, datasets, "
            "safetensors), which is not installed.",
            f"{INSTALL} (or pip install transformers safetensors).",
        ) from None
    return transformers


def _existing(key: str, value: str) -> Path:
    path = Path(value).expanduser()
    if not path.exists():
        raise ConfigError(key, f"{value!r} does not exist.", f"give a local path: {key}=DIR.")
    return path


def load_config(value: str) -> Any:
    """A transformers config from a directory (config.json) or a JSON file with `model_type`."""
    transformers = require_transformers()
    path = _existing("model.config", value)
    if path.is_dir():
        return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    try:
        data = json.loads(path.read_text())
        model_type = data.pop("model_type")
    except (ValueError, KeyError, AttributeError) as exc:
        raise ConfigError(
            "model.config",
            f"{value} is not a transformers config JSON ({type(exc).__name__}: {exc}).",
            'give a config.json with "model_type" (e.g. "llama", "gpt2", "qwen2") or its '
            "directory.",
        ) from None
    return transformers.AutoConfig.for_model(model_type, **data)


def build_hf(
    path: str | None = None, config: str | None = None, seq_len: int | None = None, **kwargs: Any
) -> nn.Module:
    """A causal LM in fp32 with the KV cache off (training). seq_len is checked against the
    config's context length where it has one."""
    transformers = require_transformers()
    if (path is None) == (config is None):
        raise ConfigError(
            ["model.path", "model.config"],
            "model=hf needs exactly one of them.",
            "model.path=DIR for a local checkpoint, or model.config=DIR_OR_JSON for random "
            "weights.",
        )
    auto = transformers.AutoModelForCausalLM
    on_meta = torch.get_default_device().type == "meta"
    if path is not None:
        source = _existing("model.path", path)
        if on_meta:
            hf_config = transformers.AutoConfig.from_pretrained(str(source), local_files_only=True)
            model = auto.from_config(hf_config, **kwargs)
        else:
            model = auto.from_pretrained(
                str(source), local_files_only=True, dtype=torch.float32, **kwargs
            )
    else:
        assert config is not None
        hf_config = load_config(config)
        # A key of the config (+model.vocab_size=N) overrides it; the rest go to from_config.
        for key in [k for k in kwargs if k not in FROM_CONFIG_ARGS and hasattr(hf_config, k)]:
            setattr(hf_config, key, kwargs.pop(key))
        model = auto.from_config(hf_config, **kwargs)
    model.config.use_cache = False
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(
        model.config, "n_positions", None
    )
    if seq_len is not None and isinstance(limit, int) and seq_len > limit:
        raise ConfigError(
            "model.seq_len",
            f"{seq_len} is longer than the model's context ({limit} positions).",
            f"set model.seq_len to at most {limit}.",
        )
    return model.float()
