"""What parallel.tp > 1 composes with today, checked before anything starts: one ConfigError
each, naming the keys, with a Fix that works as printed (docs/parallelism.md has the table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.config.ac import AcPolicy
from launcher.config.engine import EngineName
from launcher.config.model import HF_TARGET, ModelConfig, UserModelConfig
from launcher.errors import ConfigError

if TYPE_CHECKING:
    from launcher.config.root import RootConfig

NOT_YET = "parallel.tp=1"
"""The fix that always works: no tensor parallelism."""


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, limit + 1) if n % d == 0]


def _largest_tp(cfg: RootConfig, model: ModelConfig) -> int:
    """The largest tp below the asked one that the model allows."""
    ok = [
        t
        for t in range(cfg.parallel.tp - 1, 0, -1)
        if model.n_head % t == 0
        and model.vocab % t == 0
        and (not cfg.parallel.sequence_sharded or model.seq_len % t == 0)
    ]
    return ok[0] if ok else 1


def check_tensor_parallel(cfg: RootConfig) -> None:
    """parallel.tp > 1: the engine, the model family, the shape and the features it composes
    with. A tp of 1 passes untouched."""
    tp = cfg.parallel.tp
    if tp == 1:
        if cfg.parallel.sequence_parallel:
            raise ConfigError(
                ["parallel.sequence_parallel", "parallel.tp"],
                "sequence parallelism shards the sequence over a tensor-parallel group, and "
                "parallel.tp=1 has none.",
                "set parallel.tp=2 (or more), or drop parallel.sequence_parallel.",
            )
        return
    if cfg.engine.name == EngineName.deepspeed:
        raise ConfigError(
            ["parallel.tp", "engine"],
            f"parallel.tp={tp}: tensor parallelism composes with engine=fsdp and engine=ddp; "
            "DeepSpeed's AutoTP training is not wired in (nor certified token-exact).",
            "add engine=fsdp (FSDP2 over the data-parallel ranks), or set parallel.tp=1.",
        )
    if isinstance(cfg.model, UserModelConfig):
        _check_user_model(cfg, cfg.model)
    else:
        _check_shape(cfg, cfg.model)
    _check_features(cfg)


def _check_user_model(cfg: RootConfig, model: UserModelConfig) -> None:
    """model.tp_plan (the user's module-name patterns), else model=hf's family plan (both
    checked on the built model when the plan builds it: launcher/models/tp_plan.py and
    tensor_parallel.py); neither with sequence parallelism."""
    tp = cfg.parallel.tp
    if not model.tp_plan and model._target_ != HF_TARGET:
        raise ConfigError(
            ["parallel.tp", "model.tp_plan"],
            f"parallel.tp={tp}: {model._target_} has no tensor-parallel plan. model.tp_plan "
            "names the layers to split: module-name patterns -> colwise, rowwise or colwise_rep, "
            "e.g. {blocks.*.attn.q: colwise, blocks.*.attn.out: rowwise, ...}.",
            'add model.tp_plan to the model\'s config (docs/parallelism.md, "Your own model", '
            f"has a complete example), or set {NOT_YET}.",
        )
    if cfg.parallel.sequence_parallel:
        plan = "model.tp_plan" if model.tp_plan else "a Hugging Face family's base_model_tp_plan"
        raise ConfigError(
            ["parallel.sequence_parallel", "model"],
            f"sequence parallelism is in the built-in GPT's plan only; {plan} splits heads and "
            "the MLP, with whole activations between them.",
            "set parallel.sequence_parallel=false (or null).",
        )
    cfg.parallel.sequence_parallel = False  # null: off for a model's own plan


def _check_shape(cfg: RootConfig, model: ModelConfig) -> None:
    tp = cfg.parallel.tp
    fix = f"set parallel.tp={_largest_tp(cfg, model)}"
    if model.n_head % tp:
        raise ConfigError(
            ["parallel.tp", "model.n_head"],
            f"tp={tp} does not divide n_head={model.n_head}: heads stay whole on a rank.",
            f"{fix}, or a model.n_head that tp divides (divisors of {model.n_head}: "
            f"{', '.join(map(str, _divisors(model.n_head, model.n_head)))}).",
        )
    if model.vocab % tp:
        raise ConfigError(
            ["parallel.tp", "model.vocab_size"],
            f"tp={tp} does not divide the vocabulary of {model.vocab} tokens (the embedding and "
            "the head are split by vocabulary rows).",
            f"{fix}, or model.vocab_size={-(-model.vocab // tp) * tp} (a multiple of {tp}).",
        )
    if cfg.parallel.sequence_sharded and model.seq_len % tp:
        raise ConfigError(
            ["parallel.tp", "model.seq_len", "parallel.sequence_parallel"],
            f"sequence parallelism splits each sequence of {model.seq_len} tokens into tp={tp} "
            "equal shards.",
            f"{fix}, or model.seq_len={-(-model.seq_len // tp) * tp} (a multiple of {tp}), or "
            "parallel.sequence_parallel=false.",
        )


def _check_features(cfg: RootConfig) -> None:
    """Features not composed with tensor parallelism yet: refused, naming the key."""
    tp = cfg.parallel.tp
    refused = [
        (cfg.adapter.enabled, "adapter", "set adapter=none"),
        (cfg.parallel.elastic, "parallel.min_nodes", "drop parallel.min_nodes"),
        # The selective op policy reads tensors' storages, which a DTensor's ops do not have.
        (cfg.ac.policy == AcPolicy.selective, "ac=selective", "use ac=full (or every_n, sqrt)"),
        (bool(cfg.eval.harness.every), "eval.harness.every", "set eval.harness.every=0"),
    ]
    if cfg.data.document_masks:
        key, fix = _without_document_masks(cfg)
        raise ConfigError(
            [key, "parallel.tp"],
            "each document's own positions and attention inside a sequence (data=hf documents "
            f"cut into windows, or data.packing=true) are not composed with tensor parallelism "
            f"(parallel.tp={tp}) yet.",
            f"{fix}, or set {NOT_YET}.",
        )
    for on, key, fix in refused:
        if on:
            raise ConfigError(
                [key.split("=")[0], "parallel.tp"],
                f"{key} is not composed with tensor parallelism (parallel.tp={tp}) yet.",
                f"{fix}, or set {NOT_YET}.",
            )


def _without_document_masks(cfg: RootConfig) -> tuple[str, str]:
    """(the key, the fix) that gives data=hf sequences without each document's own positions and
    attention: fine-tuning records one per padded sequence; documents concatenated with attention
    across them (data.packing=false alone keeps the masks for documents)."""
    if cfg.data.tuning:
        return "data.packing", "set data.packing=false"
    if cfg.data.packing is True:
        fix = "set data.packing=false data.cross_document_attention=true"
        return "data.packing", fix
    return "data.cross_document_attention", "set data.cross_document_attention=true"
