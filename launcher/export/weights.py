"""The exported files: a `from_pretrained` directory for transformers models (their own
save_pretrained), `model.safetensors` + the model config otherwise. Every safetensors file says
in its metadata which launcher run and step it came from."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from launcher.config.model import ModelConfig, UserModelConfig
from launcher.config.root import RootConfig
from launcher.models.gpt import GPT
from launcher.models.user import locate_target, model_arguments

WEIGHTS_FILE = "model.safetensors"
MODEL_CONFIG_FILE = "model.yaml"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def is_transformers(model: nn.Module) -> bool:
    return hasattr(model, "save_pretrained") and hasattr(model, "config")


def write_transformers(model: nn.Module, directory: Path, dtype: torch.dtype) -> None:
    """config.json, generation_config.json and the safetensors shards (with an index above
    transformers' shard size), written by transformers itself."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line in the log says it is done
    hf: Any = model  # a transformers PreTrainedModel
    hf.__dict__.pop("forward", None)  # the launcher's logits-only forward (models/output.py)
    hf.to(dtype)
    hf.config.use_cache = True  # off for training only; users generate with the cache
    hf.save_pretrained(str(directory))


def write_plain(model: nn.Module, cfg: RootConfig, directory: Path, dtype: torch.dtype) -> None:
    """model.safetensors under the model's own parameter names (tied weights under each name,
    so load_state_dict(strict=True) works), and model.yaml, the config that rebuilds the module
    with hydra.utils.instantiate."""
    from safetensors.torch import save_file

    tensors = {
        name: (t.to(dtype) if t.is_floating_point() else t).detach().contiguous().clone()
        for name, t in model.state_dict().items()
    }
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    write_model_config(cfg, directory)


def write_model_config(cfg: RootConfig, directory: Path) -> None:
    """model.yaml: the config that rebuilds the module with hydra.utils.instantiate."""
    from omegaconf import OmegaConf

    text = OmegaConf.to_yaml(rebuild_config(cfg))
    (directory / MODEL_CONFIG_FILE).write_text(text, encoding="utf-8")


def rebuild_config(cfg: RootConfig) -> dict[str, Any]:
    """`_target_` and the arguments the launcher built the model with."""
    model = cfg.model
    if isinstance(model, UserModelConfig):
        return {"_target_": model._target_, **model_arguments(model, locate_target(model._target_))}
    shape = {k: v for k, v in dataclasses.asdict(model).items() if k != "init_from"}
    return {
        "_target_": f"{GPT.__module__}.{GPT.__name__}",
        "cfg": {"_target_": f"{ModelConfig.__module__}.{ModelConfig.__name__}", **shape},
    }


def stamp(directory: Path, metadata: dict[str, str]) -> None:
    """Add the run's provenance to every safetensors file's metadata (kept: what was there)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            old = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (not a dict)
        save_file(tensors, str(path), metadata={**old, **metadata})


def write_tokenizer(
    tokenizer_dir: str, eos_token: str | None, directory: Path, chat_template: str | None = None
) -> None:
    """The run's tokenizer as files AutoTokenizer.from_pretrained loads: every special token
    (bos, eos, unk, pad, additional) and the chat template it had, the run's EOS as its
    eos_token. chat_template: the run's data.chat_template, in place of the tokenizer's own."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from launcher.data.chat import tokenizer_template
    from launcher.data.tokenizer import load_tokenizer

    source = Path(tokenizer_dir).expanduser()
    tok = load_tokenizer(tokenizer_dir, eos_token)
    hf: Any
    if tok.fast and not (source / "tokenizer_config.json").is_file():
        hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend)  # tokenizer.json alone
    else:  # what transformers saved: its own loader keeps every special token and setting
        hf = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    eos = tok.backend.id_to_token(tok.eos_id) if tok.fast else hf.convert_ids_to_tokens(tok.eos_id)
    if hf.eos_token != eos:
        hf.eos_token = eos
    template = chat_template or tokenizer_template(source)
    if template is not None:
        hf.chat_template = template
    hf.save_pretrained(str(directory))
