"""adapter.targets and adapter.train_modules resolved against a model's module names: pure logic
on any nn.Module (the plan's meta-device model too). Each problem is one ConfigError naming the key
and listing the names there are."""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from launcher.config.adapter import ALL_LINEAR, AdapterConfig
from launcher.errors import ConfigError

HEAD_NAMES = ("lm_head", "head", "output", "embed_out")
"""all-linear leaves out the output head (as peft does): its name when the model does not say."""
SHOWN = 12
"""Names listed in an error, at most."""


@dataclass(frozen=True)
class Resolved:
    targets: list[str]
    """Whole names of the layers that get adapters."""
    train_modules: list[str]
    """Whole names of the modules trained in full."""


def adaptable(module: nn.Module) -> bool:
    """A layer peft's LoRA adapts: linear (also transformers' GPT-2 Conv1D) or embedding."""
    return isinstance(module, (nn.Linear, nn.Embedding)) or type(module).__name__ == "Conv1D"


def _matches(pattern: str, name: str) -> bool:
    """peft's rule for a name (the whole name or its dotted suffix), else a regular expression
    over the whole name."""
    if name == pattern or name.endswith("." + pattern):
        return True
    try:
        return re.fullmatch(pattern, name) is not None
    except re.error:
        return False


def _regex_error(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as error:
        return f" (nor is it a valid regular expression: {error})"
    return ""


def _head_names(model: nn.Module) -> set[str]:
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    found = {n for n, m in model.named_modules() if head is not None and m is head}
    if not found:
        found = {n for n, _ in model.named_modules() if n.split(".")[-1] in HEAD_NAMES}
    return found


def pattern_of(name: str) -> str:
    """blocks.3.attn.qkv -> blocks.*.attn.qkv: how a repeated layer is listed."""
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def listing(names: list[str]) -> str:
    patterns = list(dict.fromkeys(pattern_of(n) for n in names))
    more = f", ... ({len(patterns) - SHOWN} more)" if len(patterns) > SHOWN else ""
    return ", ".join(patterns[:SHOWN]) + more


def _example(layers: list[str]) -> str:
    """Two of the model's own layers, named as a target names them."""
    names = [".".join(n.split(".")[-2:]) for n in layers if "." in n] or layers
    return ",".join(list(dict.fromkeys(names))[:2])


def _layer_size(module: nn.Module) -> tuple[int, int]:
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if isinstance(module, nn.Embedding):
        return module.num_embeddings, module.embedding_dim
    weight = getattr(module, "weight", None)  # Conv1D: weight [in, out]
    return (int(weight.shape[0]), int(weight.shape[1])) if weight is not None else (0, 0)


def resolve(model: nn.Module, cfg: AdapterConfig) -> Resolved:
    """The layers cfg.targets names and the modules cfg.train_modules names, checked."""
    modules = dict(model.named_modules())
    layers = [n for n, m in modules.items() if n and adaptable(m)]
    heads = _head_names(model)
    targets: list[str] = []
    for pattern in cfg.targets:
        if pattern == ALL_LINEAR:
            found = [
                n for n in layers if not isinstance(modules[n], nn.Embedding) and n not in heads
            ]
        else:
            found = [n for n in layers if _matches(pattern, n)]
        if not found:
            raise ConfigError(
                "adapter.targets",
                f"{pattern!r} matches no layer an adapter can go on{_regex_error(pattern)}. "
                "The model's linear and "
                f"embedding layers: {listing(layers)}.",
                f"name layers by their last parts (e.g. adapter.targets=[{_example(layers)}]), "
                f"by a regular expression over the whole name, or [{ALL_LINEAR}].",
            )
        targets.extend(n for n in found if n not in targets)
    targets = [n for n in layers if n in set(targets)]  # in the model's order
    if targets:
        name = min(targets, key=lambda n: min(_layer_size(modules[n])))
        smaller = min(_layer_size(modules[name]))
        if cfg.rank > smaller:
            raise ConfigError(
                "adapter.rank",
                f"rank {cfg.rank} is larger than layer {name}'s smaller dimension ({smaller}; "
                f"its size is {_layer_size(modules[name])}).",
                f"set adapter.rank to at most {smaller}, or leave {pattern_of(name)} out of "
                "adapter.targets.",
            )
    trained: list[str] = []
    named = [n for n in modules if n]
    for pattern in cfg.train_modules:
        found = [n for n in named if _matches(pattern, n)]
        if not found:
            raise ConfigError(
                "adapter.train_modules",
                f"{pattern!r} matches no module of the model. Its modules: {listing(named)}.",
                "name modules by their last parts (e.g. adapter.train_modules=[tok_emb] or "
                "[embed_tokens]) or by a regular expression over the whole name.",
            )
        adapted = {id(p) for t in targets for p in modules[t].parameters()}
        both = [
            n
            for n in found
            if any(n == t or t.startswith(n + ".") for t in targets)
            or any(id(p) in adapted for p in modules[n].parameters())  # tied: tok_emb is head
        ]
        if both:
            raise ConfigError(
                ["adapter.train_modules", "adapter.targets"],
                f"{both[0]} would be both adapted and trained in full (a weight it shares "
                "with an adapted layer counts too: tok_emb is the GPT's head).",
                f"take {pattern!r} out of adapter.train_modules or its layers (or the layers "
                "tied to it) out of adapter.targets.",
            )
        trained.extend(n for n in found if n not in trained)
    return Resolved(targets, trained)


@dataclass(frozen=True)
class Counts:
    """Parameters an adapter run adds and trains (for the memory plan, on the meta model)."""

    added: int
    """Adapter parameters added to the base."""
    trainable: int
    """Adapters plus the modules trained in full."""
    sizes: tuple[int, ...]
    """Elements of each adapter tensor (A and B of every layer)."""
    block_added: int
    block_trainable: int
    """The same for the first repeated block (0 when there is none)."""


def count_parameters(
    model: nn.Module, resolved: Resolved, rank: int, block: nn.Module | None
) -> Counts:
    modules = dict(model.named_modules())
    inside = {id(m) for m in block.modules()} if block is not None else set()
    sizes: list[int] = []
    block_added = 0
    for name in resolved.targets:
        n_in, n_out = _layer_size(modules[name])
        pair = (rank * n_in, rank * n_out)
        sizes.extend(pair)
        if id(modules[name]) in inside:
            block_added += sum(pair)
    seen: set[int] = set()
    trained = block_trained = 0
    for name in resolved.train_modules:
        for param in modules[name].parameters():
            if id(param) not in seen:
                seen.add(id(param))
                trained += param.numel()
                if id(modules[name]) in inside:
                    block_trained += param.numel()
    added = sum(sizes)
    return Counts(added, added + trained, tuple(sizes), block_added, block_added + block_trained)
