"""The memory plan of a pipeline (parallel.pp > 1), per pipeline rank, from its actual stages.

One micro-batch's saved activations through a stage are `blocks x B`, plus `H` on the last stage:
B is one block's (the probe of the model less one block, subtracted from the model's: a block
saves its input and what it computes), H the rest of the model's (what the final norm, the head
and the loss save, the last block's output among them); the embedding saves no floating-point
tensor. A rank holds its schedule's micro-batches of them at once (GPipe every one, 1F1B stage s
min(grad_accum, pp - s), interleaved its warm-up), its stages' parameters (the embedding on the
first, the final norm and the tied head's copy on the last), and the engine's state of those.
The plan reports the rank with the highest peak. The default split (parallel.pp_split=null)
balances the same costs: each block's state and saved activations, the embedding's state on the
first stage, the head's state and H on the last.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from launcher.config.model import ModelConfig
from launcher.config.pipeline import GPIPE, ONE_F_ONE_B
from launcher.config.root import RootConfig
from launcher.config.stages import StageLayout, balanced_starts, stage_layout
from launcher.memory.parts import MemoryPlan, at_micro_size, host_parts, state_parts
from launcher.memory.probe import ActivationLine
from launcher.models.shape import ModelShape
from launcher.parallel.shape import activation_divisor


def _gpt(cfg: RootConfig) -> ModelConfig:
    if not isinstance(cfg.model, ModelConfig):  # the config refuses pp for other models first
        raise TypeError(f"pipeline stages of the built-in GPT only, not {type(cfg.model)}")
    return cfg.model


def without_a_block(cfg: RootConfig) -> RootConfig:
    """The same model with one block fewer, without a pipeline (it may have fewer blocks than
    stages): its probe, taken from the model's, is one block's."""
    model = _gpt(cfg)
    parallel = dataclasses.replace(cfg.parallel, pp=1, pp_split=None, pp_stages_per_rank=None)
    less = dataclasses.replace(model, n_layer=model.n_layer - 1)
    return dataclasses.replace(cfg, model=less, parallel=parallel)  # too few blocks for its stages


def part_parameters(cfg: RootConfig, shape: ModelShape) -> tuple[int, int]:
    """(the embedding's, the final norm's and the head's) parameters of the built-in GPT: the
    last stage holds its own copy of the tied embedding as the head."""
    d, seq_len = _gpt(cfg).d_model, _gpt(cfg).seq_len
    outside = shape.parameters - shape.n_blocks * shape.block_parameters
    norm = 2 * d
    embedding = outside - norm
    # sequence parallelism splits the position embedding over tp like the token embedding
    position = seq_len * d // (cfg.parallel.tp if cfg.parallel.sequence_sharded else 1)
    return embedding, norm + embedding - position


@dataclasses.dataclass(frozen=True)
class StageBytes:
    """One micro-batch's saved activation bytes: per block, and the rest on the last stage."""

    block: int
    head: int
    transient: int
    """What backward adds on top of the saved bytes at its peak, for the whole model."""

    @classmethod
    def of(
        cls, whole: ActivationLine, less_one: ActivationLine, micro_size: int, n_blocks: int
    ) -> StageBytes:
        saved = whole.saved(micro_size)
        block = max(0, saved - less_one.saved(micro_size))
        return cls(block, max(0, saved - n_blocks * block), whole.peak(micro_size) - saved)

    def stage(self, blocks: int, last: bool) -> int:
        return blocks * self.block + (self.head if last else 0)


def held(layout: StageLayout, grad_accum: int, pp_rank: int, stage: int) -> float:
    """Micro-batches of `stage` the rank holds at its peak: GPipe all of them; 1F1B the stage's
    warm-up, min(grad_accum, pp - s); interleaved (v stages per rank) the rank's warm-up of
    (v - 1) pp + 2 (pp - 1 - r) virtual micro-batches plus two in flight (torch's
    _get_warmup_ops), counted on each of its stages (an upper bound)."""
    pp, v = layout.pp, layout.per_rank
    if layout.schedule == GPIPE:
        return float(grad_accum)
    if layout.schedule == ONE_F_ONE_B:
        return float(min(grad_accum, pp - stage))
    return min(grad_accum * v, (v - 1) * pp + 2 * (pp - 1 - pp_rank) + 2) / v


def rank_shape(
    shape: ModelShape, layout: StageLayout, pp_rank: int, parts: tuple[int, int]
) -> ModelShape:
    """`shape` as pipeline rank `pp_rank` holds it: its stages' blocks, the embedding on the
    first stage's rank, the final norm and the head on the last's."""
    mine = layout.stages_of(pp_rank)
    ranges = layout.ranges()
    blocks = sum(len(ranges[s]) for s in mine)
    parameters = blocks * shape.block_parameters
    parameters += parts[0] if 0 in mine else 0
    parameters += parts[1] if layout.n_stages - 1 in mine else 0
    return dataclasses.replace(shape, parameters=parameters, n_blocks=blocks)


def plan_stages(
    cfg: RootConfig,
    shape: ModelShape,
    whole: ActivationLine,
    less_one: ActivationLine,
    micro_size: int,
) -> MemoryPlan:
    """The plan of the pipeline's busiest rank (the highest planned peak); `pipeline` holds every
    stage's saved bytes of one micro-batch and every rank's plan."""
    cfg = at_micro_size(cfg, micro_size)
    layout = stage_layout(cfg)
    grad_accum = cfg.split().grad_accum
    shards = activation_divisor(cfg)
    per = StageBytes.of(whole, less_one, micro_size, shape.n_blocks)
    ranges = layout.ranges()
    last = layout.n_stages - 1
    saved = [per.stage(len(ranges[s]), s == last) // shards for s in range(layout.n_stages)]
    parts = part_parameters(cfg, shape)
    total = max(1, whole.saved(micro_size))
    ranks: list[dict[str, Any]] = []
    plans: list[MemoryPlan] = []
    for r in range(layout.pp):
        mine = layout.stages_of(r)
        counts = [held(layout, grad_accum, r, s) for s in mine]
        if layout.per_rank > 1:  # the warm-up's micro-batches, each on the costliest stage
            kept = max(counts) * len(mine) * max(saved[s] for s in mine)
        else:
            kept = counts[0] * saved[mine[0]]
        one = sum(saved[s] for s in mine)
        transient = per.transient * one // total  # `one` is a tensor-parallel rank's
        rank = rank_shape(shape, layout, r, parts)
        plan = MemoryPlan(
            parts={**state_parts(cfg, rank), "activations": int(kept) + transient},
            micro_size=micro_size,
            ac=cfg.ac.policy.value,
            activation_bytes=one,
            method=whole.method,
            host_parts={k: int(n) for k, n in host_parts(cfg, rank).items()},
        )
        plans.append(plan)
        ranks.append(
            {
                "pp_rank": r,
                "stages": mine,
                "parameters": rank.parameters,
                "held_micro_batches": round(int(kept) / one, 3) if one else 0.0,
                "activation_bytes": int(kept),
                "planned_peak_bytes": plan.peak,
            }
        )
    peak = max(range(layout.pp), key=lambda r: plans[r].peak)
    ranks[peak]["peak"] = True
    return dataclasses.replace(
        plans[peak],
        pipeline={"split": list(layout.starts), "stage_activation_bytes": saved, "ranks": ranks},
    )


def balanced_split(
    cfg: RootConfig,
    shape: ModelShape,
    whole: ActivationLine,
    less_one: ActivationLine,
    micro_size: int,
) -> list[int]:
    """parallel.pp_split=null: where stages 1.. start, the costliest stage made as cheap as it
    can be. A block costs its parameters' share of the engine's state (bytes per parameter of
    the whole model's plan) and one micro-batch's saved activations; the first stage adds the
    embedding's state, the last the final norm's and the head's state and what they save."""
    cfg = at_micro_size(cfg, micro_size)
    layout = stage_layout(cfg)
    per = StageBytes.of(whole, less_one, micro_size, shape.n_blocks)
    per_parameter = sum(state_parts(cfg, shape).values()) / max(1, shape.parameters)
    embedding, head = part_parameters(cfg, shape)
    block = round(shape.block_parameters * per_parameter) + per.block
    return balanced_starts(
        [block] * shape.n_blocks,
        round(embedding * per_parameter),
        round(head * per_parameter) + per.head,
        layout.n_stages,
    )
