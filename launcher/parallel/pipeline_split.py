"""The built-in GPT cut into pipeline stages that keep the whole model's parameter names.

A stage is a module with the GPT's own attribute names (tok_emb, pos_emb, blocks, ln_f, head)
holding only its parts: blocks.2 stays blocks.2 on the stage that owns it, so a stage's
state_dict keys are the whole model's (torchtitan's way). A rank's stages (one, or
parallel.pp_stages_per_rank with the interleaved schedule) are gathered in one module of the
same names, `RankStages`: what the engine wraps, the optimizer steps and DCP checkpoints.
Together the ranks' checkpoints hold one process's names and load into a run with another pp
(or none) unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from launcher.config.root import RootConfig
from launcher.config.stages import StageLayout, stage_layout
from launcher.errors import ConfigError
from launcher.models.gpt import GPT, BlockRunner, run_in_order

TIED_FIRST, TIED_LAST = "tok_emb.weight", "head.weight"
"""The GPT ties its head to its embedding: the first stage holds the one, the last the other."""


class StageBlocks(nn.ModuleList):
    """Blocks under their whole-model indices (children named "2", "3" on a stage that starts at
    block 2), indexed by position, as recompute's segments count them."""

    def __init__(self, named: dict[str, nn.Module]) -> None:
        super().__init__()
        for name, block in named.items():
            self.add_module(name, block)

    def __getitem__(self, index: int | slice) -> nn.Module:  # type: ignore[override]
        if isinstance(index, slice):
            return nn.ModuleList(list(self)[index])
        return list(self)[index]


class GPTStage(nn.Module):
    """One pipeline stage of the built-in GPT: the embedding on the first stage, its blocks, the
    final norm and the head on the last. forward takes token ids (first stage) or the previous
    stage's activations, and returns activations or (last stage) logits."""

    def __init__(self, gpt: GPT, index: int, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        self.cfg = gpt.cfg
        self.index, self.first, self.last = index, first, last
        if first:
            self.tok_emb, self.pos_emb, self.drop = gpt.tok_emb, gpt.pos_emb, gpt.drop
        self.blocks = StageBlocks({str(i): gpt.blocks[i] for i in blocks})
        self.run_blocks: BlockRunner = run_in_order
        if last:
            self.ln_f, self.head = gpt.ln_f, gpt.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.drop(self.tok_emb(x) + self.pos_emb(pos))
        x = self.run_blocks(self.blocks, x)
        return self.head(self.ln_f(x)) if self.last else x


class RankStages(nn.Module):
    """This rank's pipeline stages as one module under the whole model's names. `stages` (a plain
    list, not registered: the names stay one process's) run them: each is a GPTStage sharing
    these parts, the submodule of one torch PipelineStage."""

    def __init__(self, gpt: GPT, layout: StageLayout, pp_rank: int) -> None:
        super().__init__()
        n_stages = layout.n_stages
        ranges = layout.ranges()
        mine = layout.stages_of(pp_rank)
        self.stages = [GPTStage(gpt, s, ranges[s], s == 0, s == n_stages - 1) for s in mine]
        self.n_stages = n_stages
        first, last = self.stages[0].first, self.stages[-1].last
        if first:
            self.tok_emb, self.pos_emb, self.drop = gpt.tok_emb, gpt.pos_emb, gpt.drop
        self.blocks = StageBlocks({str(i): gpt.blocks[i] for s in mine for i in ranges[s]})
        if last:
            self.ln_f, self.head = gpt.ln_f, gpt.head
        tied = gpt.head.weight is gpt.tok_emb.weight
        self.tied_name = (TIED_FIRST if first else TIED_LAST if last else None) if tied else None
        """This rank's copy of the tied embedding/head weight (its gradient is summed with the
        other end's every step), or None."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a pipeline rank's stages run through its schedule (stages), not here")


def split_for_rank(model: nn.Module, cfg: RootConfig, pp_rank: int) -> RankStages:
    """The stages pipeline rank `pp_rank` holds: runs of blocks from parallel.pp_split (the plan
    resolved the balanced default into it; the config checked it)."""
    if not isinstance(model, GPT):  # the config refuses this first; a plain error, no traceback
        raise ConfigError(
            ["parallel.pp", "model"],
            f"parallel.pp={cfg.parallel.pp}: no pipeline stages for {type(model).__name__}.",
            "set parallel.pp=1.",
        )
    return RankStages(model, stage_layout(cfg), pp_rank)


def stage_parts(model: nn.Module) -> list[nn.Module]:
    """The modules that run: a pipeline rank's stages, or the model itself (recompute policies
    and FSDP2's roots act on these)."""
    return list(model.stages) if isinstance(model, RankStages) else [model]


def optimizer_aliases(model: nn.Module) -> dict[str, str]:
    """Names under which a checkpoint holds this rank's optimizer state: the last stage's copy
    of the tied head is one process's tied embedding (whose state it equals), so checkpoints of
    any pp name it as one process does and load into any other layout."""
    if isinstance(model, RankStages) and model.tied_name == TIED_LAST:
        return {TIED_LAST: TIED_FIRST}
    return {}
