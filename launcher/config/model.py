"""The model section: the built-in GPT's shape (ModelConfig) or the user's own model by
`_target_` (UserModelConfig, model=custom and model=hf)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.config.checks import require_finite, require_positive
from launcher.errors import ConfigError

AUTO = "auto"
BYTE_VOCAB = 256
"""The vocabulary of byte-level data (every built-in dataset but data=tokens and data=hf)."""
HF_TARGET = "launcher.models.hf.build_hf"
"""model=hf's builder: with model.config, random weights whose vocab_size may be overridden."""

if TYPE_CHECKING:
    VocabSize = int | str
else:  # OmegaConf 2.3 has no unions: an open node, checked in ModelConfig.__post_init__
    VocabSize = Any


def check_vocab_size(value: Any) -> None:
    """model.vocab_size: a positive number of tokens, or auto."""
    if value == AUTO:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            "model.vocab_size",
            f"must be a positive number of tokens or auto, got {value!r}.",
            "set model.vocab_size=auto (the tokenizer's with data=hf, else 256 bytes).",
        )


@dataclass
class ModelConfig:
    """A decoder-only GPT with pre-norm blocks and byte-level tokens."""

    name: str = "tiny"
    """A label for logs; the shape below is what counts."""
    n_layer: int = 4
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide d_model."""
    d_model: int = 128
    """Residual stream width."""
    seq_len: int = 32
    """Tokens per sequence (the context length)."""
    dropout: float = 0.0
    """Dropout on attention and residual paths (0 for exact comparisons)."""
    vocab_size: VocabSize = AUTO
    """Tokens the model embeds and predicts. auto: the tokenizer's vocabulary with data=hf (said
    in the plan), else 256 (bytes); resolved before anything runs."""
    mlp_ratio: int = 4
    """Hidden width of the MLP as a multiple of d_model."""
    init_from: str | None = None
    """Start from these weights: a `launch export` directory (or its model.safetensors)."""

    def __post_init__(self) -> None:
        require_finite("model", self)
        for key in ("n_layer", "n_head", "d_model", "seq_len", "mlp_ratio"):
            require_positive(f"model.{key}", getattr(self, key))
        check_vocab_size(self.vocab_size)
        if self.d_model % self.n_head:
            raise ConfigError(
                ["model.d_model", "model.n_head"],
                f"d_model={self.d_model} is not divisible by n_head={self.n_head}.",
                "choose n_head that divides d_model.",
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("model.dropout", f"must be in [0, 1), got {self.dropout}.")

    @property
    def vocab(self) -> int:
        """model.vocab_size as a number (auto still unresolved: bytes)."""
        return BYTE_VOCAB if self.vocab_size == AUTO else int(self.vocab_size)

    def fingerprint(self) -> dict[str, Any]:
        """The shape a resumed run must keep (checkpoint compatibility)."""
        keys = ("n_layer", "n_head", "d_model", "seq_len", "vocab_size", "mlp_ratio")
        shape = {**vars(self), "vocab_size": self.vocab}
        return {**{f"model.{key}": shape[key] for key in keys}, QKV_ROWS_KEY: QKV_ROWS}


QKV_ROWS_KEY, QKV_ROWS = "model.qkv_rows", "by_head"
"""The built-in GPT's fused qkv rows are grouped by head (q, k, v of head 0, then head 1, ...)
since 2026-12-04, so that a tensor-parallel shard holds whole heads; before, [q; k; v] whole.
A checkpoint's fingerprint without this key has the old rows (launcher/checkpoint/compat.py)."""

LAUNCHER_KEYS = ("_target_", "name", "seq_len", "blocks", "init_from", "tp_plan")
"""A user model's keys that the launcher reads; every other key is the model's own argument."""


@dataclass
class UserModelConfig:
    """The user's own nn.Module, built by Hydra's `_target_` (model=custom, model=hf)."""

    _target_: str = ""
    """The class or function that builds the model, e.g. my_project.models.Net."""
    name: str = "custom"
    """A label for logs."""
    seq_len: int = 64
    """Tokens per sequence; also passed to the target when it takes a `seq_len` argument."""
    blocks: str | None = None
    """Dotted path of the repeated blocks (an nn.ModuleList, e.g. model.layers); null: found."""
    init_from: str | None = None
    """Start from these weights: a `launch export` directory (or its model.safetensors)."""
    tp_plan: dict[str, str] | None = None
    """Tensor parallelism of this model (parallel.tp > 1): module-name pattern (fnmatch on each
    dotted part, e.g. blocks.*.attn.q) -> colwise, rowwise or colwise_rep (docs/parallelism.md).
    null or empty: none (model=hf: the family's own base_model_tp_plan)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The model's own arguments (every other key of the model section), passed to the target."""

    def __post_init__(self) -> None:
        if not self._target_ or not isinstance(self._target_, str):
            raise ConfigError(
                "model._target_",
                "is empty: a user model needs the class or function that builds it.",
                "set model._target_=my_project.models.Net (importable from here or PYTHONPATH).",
            )
        require_positive("model.seq_len", self.seq_len)
        clash = sorted(set(self.kwargs) & set(LAUNCHER_KEYS))
        if clash:
            raise ConfigError(f"model.kwargs.{clash[0]}", "is a launcher key.", "set it directly.")
        check_tp_plan(self.tp_plan or {})

    def fingerprint(self) -> dict[str, Any]:
        args = {f"model.{key}": value for key, value in sorted(self.kwargs.items())}
        return {"model._target_": self._target_, "model.seq_len": self.seq_len, **args}

    def plain(self) -> dict[str, Any]:
        """The section as written in a config file: the launcher's keys, then the model's own."""
        return {
            "_target_": self._target_,
            "name": self.name,
            "seq_len": self.seq_len,
            "blocks": self.blocks,
            "init_from": self.init_from,
            **({"tp_plan": dict(self.tp_plan)} if self.tp_plan else {}),
            **self.kwargs,
        }


TP_STYLES = ("colwise", "rowwise", "colwise_rep")
"""model.tp_plan's styles, in transformers' words: colwise splits a layer's outputs (nn.Linear's
rows, nn.Embedding's width), rowwise its inputs (nn.Linear's columns, nn.Embedding's vocabulary
rows) and sums the ranks' partial outputs, colwise_rep splits the outputs and gathers them whole
(a vocabulary-split head whose logits the loss reads whole)."""


def check_tp_plan(plan: Mapping[str, Any]) -> None:
    """Each pattern names a submodule and each style is one of TP_STYLES (whether a pattern
    matches a layer is checked on the built model: launcher/models/tp_plan.py)."""
    for pattern, style in plan.items():
        if not str(pattern).strip(". "):
            raise ConfigError(
                "model.tp_plan",
                f"the pattern {pattern!r} names no submodule (the plan splits layers, not the "
                "whole model).",
                "name the layers, e.g. blocks.*.attn.q: colwise (docs/parallelism.md).",
            )
        if style in ("sequence", "sequence_parallel"):
            raise ConfigError(
                ["model.tp_plan", "parallel.sequence_parallel"],
                f"{pattern}: {style}: sequence parallelism is in the built-in GPT's plan only; a "
                "model's own plan splits its Linear and Embedding layers, with whole activations "
                "(norms included) between them.",
                f"remove {pattern} from model.tp_plan (its norms stay whole on every rank).",
            )
        if style not in TP_STYLES:
            raise ConfigError(
                "model.tp_plan",
                f"{pattern}: {style!r} is not a tensor-parallel style.",
                f"give {pattern} one of {', '.join(TP_STYLES)} in model.tp_plan.",
            )


AnyModelConfig = ModelConfig | UserModelConfig


def blocks_path(cfg: AnyModelConfig) -> str | None:
    """model.blocks where the model section has it (a user model), else None: found."""
    return cfg.blocks if isinstance(cfg, UserModelConfig) else None


def is_user_model(node: Any) -> bool:
    """A model section with `_target_` is the user's own model; without it, the built-in GPT."""
    return node is not None and "_target_" in node


def split_user_model(node: Mapping[str, Any]) -> dict[str, Any]:
    """A user model section (flat, as in YAML) -> UserModelConfig's fields (the rest in kwargs)."""
    known = {k: node[k] for k in LAUNCHER_KEYS if k in node}
    extra = {str(k): v for k, v in node.items() if k not in LAUNCHER_KEYS and k != "kwargs"}
    nested = node.get("kwargs") or {}
    return {**known, "kwargs": {**dict(nested), **extra}}
