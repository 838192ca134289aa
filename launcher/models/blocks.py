"""The repeated blocks of any model: what recompute policies and FSDP's per-block sharding act on.

Found, not assumed: `model.blocks=PATH` names the nn.ModuleList (a dotted path such as
`model.layers`); otherwise the longest nn.ModuleList whose children are all of one class
(`blocks` of the built-in GPT, `model.layers` of Llama/Qwen, `transformer.h` of GPT-2). Ties go to
the list met first. A model without one has no blocks: a policy or engine that needs them refuses.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from launcher.errors import ConfigError


@dataclass(frozen=True)
class BlockList:
    path: str
    """Dotted path from the model's root, e.g. model.layers."""
    blocks: nn.ModuleList

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def block_class(self) -> str:
        return type(self.blocks[0]).__name__ if len(self.blocks) else "-"


def _uniform(modules: nn.ModuleList) -> bool:
    return len(modules) > 0 and len({type(m) for m in modules}) == 1


def find_blocks(model: nn.Module, path: str | None = None) -> BlockList | None:
    """The model's block list: the one at `path`, else the longest uniform nn.ModuleList."""
    if path:
        try:
            found = model.get_submodule(path)
        except AttributeError:
            found = None
        if not isinstance(found, nn.ModuleList) or len(found) == 0:
            lists = ", ".join(c.path for c in candidates(model)) or "none"
            raise ConfigError(
                "model.blocks",
                f"{path!r} is not a non-empty nn.ModuleList of the model.",
                f"name one of its block lists ({lists}), or leave model.blocks null to find it.",
            )
        return BlockList(path, found)
    found_lists = candidates(model)
    if not found_lists:
        return None
    return max(found_lists, key=len)  # max keeps the first of equal lengths


def candidates(model: nn.Module) -> list[BlockList]:
    """Every uniform nn.ModuleList in the model, outermost first."""
    return [
        BlockList(name, module)
        for name, module in model.named_modules()
        if name and isinstance(module, nn.ModuleList) and _uniform(module)
    ]


def require_blocks(model: nn.Module, path: str | None, needed_by: str) -> BlockList:
    """The block list, or a ConfigError naming what needs it and how to fix it."""
    found = find_blocks(model, path)
    if found is None:
        raise ConfigError(
            "model.blocks",
            f"{needed_by} needs the model's repeated blocks, and {type(model).__name__} has no "
            "nn.ModuleList of one block class.",
            "keep the blocks in an nn.ModuleList and name it with model.blocks=PATH, or use "
            "ac=none and engine=ddp.",
        )
    return found
