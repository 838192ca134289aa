"""`batch.micro_size=auto` and `ac=auto`: the split and granularity a run uses, from the plan.

Candidates keep the global batch (micro sizes are the divisors of the per-rank batch; grad_accum
follows), so the chosen run trains exactly the run asked for. A candidate fits when its planned
peak is within the budget less SAFETY_MARGIN. Among those that fit, the fastest by a simple step-
time model: recompute FLOPs ratio x (1 + MICRO_BATCH_OVERHEAD / micro_size), since small
micro-batches run below the device's speed; ties go to the larger micro-batch. Offload
(engine.offload, EngineSpec.offload_variants) is tried only when nothing fits without it: it
trades step time for device memory, and the reason says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from launcher.config.ac import AcPolicy
from launcher.config.batch import divisors
from launcher.config.pipeline import accumulation_ok, bubble
from launcher.config.root import RootConfig
from launcher.config.stages import stages_per_rank
from launcher.engines import engine_spec
from launcher.errors import ConfigError
from launcher.memory.budget import SAFETY_MARGIN, Budget, over_budget, size, usable
from launcher.memory.parts import MemoryPlan
from launcher.memory.planner import Planner
from launcher.models.probe import ModelInfo
from launcher.models.shape import ModelShape
from launcher.parallel.shape import per_tp_rank

MICRO_BATCH_OVERHEAD = 0.25
"""Step-time model: a micro-batch of one sequence costs this much more per sequence than a large
one (kernel launches, the per-micro-batch loss and hooks)."""


@dataclass(frozen=True)
class Choice:
    micro_size: int
    policy: AcPolicy
    plan: MemoryPlan
    reason: str
    request: dict[str, Any]
    """What was asked: batch.micro_size and ac as given."""
    variant: RootConfig | None = None
    """The engine options chosen with it (engine.offload), when they differ from the request."""

    def to_json(self) -> dict[str, Any]:
        return {
            "requested": self.request,
            "micro_size": self.micro_size,
            "ac": self.policy.value,
            "reason": self.reason,
        }


def relative_step_time(planner: Planner, micro_size: int, policy: AcPolicy) -> float:
    """The step time model: recompute's FLOPs, each micro-batch's fixed cost and, under pp, the
    pipeline's bubble (fewer, larger micro-batches idle the stages longer)."""
    time = planner.flops_ratio(policy) * (1 + MICRO_BATCH_OVERHEAD / micro_size)
    parallel = planner.cfg.parallel
    if parallel.pp == 1:
        return time
    split = planner.cfg.split()
    grad_accum = split.global_size // split.dp // micro_size
    per_rank = stages_per_rank(parallel.pp_schedule, parallel.pp_stages_per_rank)
    return time / (1 - bubble(parallel.pp, grad_accum, per_rank))


def candidate_micro_sizes(cfg: RootConfig) -> list[int]:
    """batch.micro_size=auto's candidates, largest first: the divisors of a rank's share of the
    global batch whose accumulation the pipeline's schedule runs."""
    split = cfg.split()
    per_rank = split.global_size // split.dp
    schedule, pp = cfg.parallel.pp_schedule, cfg.parallel.pp
    return [m for m in reversed(divisors(per_rank)) if accumulation_ok(schedule, pp, per_rank // m)]


def _request(cfg: RootConfig) -> dict[str, Any]:
    return {"batch.micro_size": cfg.batch.micro_size, "ac": cfg.ac.policy.value}


def choose(planner: Planner, budget: Budget | None) -> Choice:
    """The micro size and policy to run (the request's own when neither is auto); raises the
    over-budget ConfigError when nothing fits."""
    cfg = planner.cfg
    split = cfg.split()
    per_rank = split.global_size // split.dp
    auto_micro, auto_ac = cfg.batch.auto, cfg.ac.policy == AcPolicy.auto
    micros = candidate_micro_sizes(cfg) if auto_micro else []
    micros = micros or [split.micro_size]
    policies = planner.policies() if auto_ac else [cfg.ac.policy]
    if budget is None:  # the fastest by the step-time model: the largest micro size at pp=1
        policy = policies[0]
        micro = min(micros, key=lambda m: (relative_step_time(planner, m, policy), -m))
        plan = planner.plan(micro, policy)
        why = "no memory budget (set train.memory_budget: a SLURM job on GPUs has no default)"
        reason = _reason(micro, policy, per_rank, why, auto_micro, auto_ac)
        return Choice(micro, policy, plan, reason, _request(cfg))
    exact = not (auto_micro or auto_ac)
    margin = 0.0 if exact else SAFETY_MARGIN
    target = usable(budget.bytes, margin)
    # Fastest first by the step-time model (known before any probe), so the first candidate that
    # fits is the choice, and the granularities after it are never probed.
    order = sorted(
        ((relative_step_time(planner, m, p), -m, p) for m in micros for p in policies),
        key=lambda c: (c[0], c[1]),
    )
    chosen: tuple[int, AcPolicy, MemoryPlan] | None = None
    offload: tuple[str, RootConfig] | None = None
    variants = [("", cfg)]
    if not exact:  # offload only when nothing fits without it
        variants += engine_spec(cfg.engine.name).offload_variants(cfg)
    for key, variant in variants:
        for _, neg_micro, policy in order:
            plan = planner.plan(-neg_micro, policy, variant)
            if plan.peak <= target:
                chosen = (-neg_micro, policy, plan)
                break
        if chosen is not None:
            offload = (key, variant) if key else None
            break
    if chosen is None:
        # The request's own engine options, at the candidate closest to fitting.
        tried = [planner.plan(-neg_micro, policy) for _, neg_micro, policy in order]
        plan = min(tried, key=lambda p: p.peak)
        raise over_budget(planner, plan, budget, margin)
    micro, policy, plan = chosen
    why = (
        f"the fastest fit: planned peak {size(plan.peak)} within {size(target)} "
        f"({budget.source}{'' if exact else f' less {SAFETY_MARGIN:.0%}'})"
    )
    larger = [m for m in micros if m > micro]
    if auto_micro and larger:
        bigger = planner.plan(larger[-1], policy)
        if bigger.peak > target:
            why += f"; batch.micro_size={larger[-1]} would need {size(bigger.peak)}"
        else:  # under pp, fewer micro-batches leave a larger bubble
            why += f"; batch.micro_size={larger[-1]} fits but its steps are slower"
    if offload is not None:
        moved = size(sum(plan.host_parts.values()))
        why = (
            f"nothing fits on the device without offload, so {offload[0]} ({moved} per rank in "
            f"host memory, slower steps); {why}"
        )
    reason = _reason(micro, policy, per_rank, why, auto_micro, auto_ac)
    chosen_variant = offload[1] if offload is not None else None
    return Choice(micro, policy, plan, reason, _request(cfg), chosen_variant)


def _reason(
    micro: int, policy: AcPolicy, per_rank: int, why: str, auto_micro: bool, auto_ac: bool
) -> str:
    chosen = []
    if auto_micro:
        chosen.append(f"batch.micro_size={micro} (grad_accum {per_rank // micro})")
    if auto_ac:
        chosen.append(f"ac={policy.value}")
    if not chosen:
        return why
    return f"chose {' and '.join(chosen)}: {why}"


def resolved(cfg: RootConfig, choice: Choice) -> RootConfig:
    """The config the ranks run: the chosen micro size (grad_accum derived), policy and
    offload."""
    if choice.variant is not None:
        cfg = dataclasses.replace(cfg, engine=choice.variant.engine)
    if cfg.batch.auto:
        batch = dataclasses.replace(cfg.batch, micro_size=choice.micro_size, grad_accum=None)
        cfg = dataclasses.replace(cfg, batch=batch)
    if cfg.ac.policy == AcPolicy.auto:
        cfg = dataclasses.replace(cfg, ac=dataclasses.replace(cfg.ac, policy=choice.policy))
    if cfg.parallel.pp > 1 and cfg.parallel.pp_split is None and choice.plan.pipeline:
        split = choice.plan.pipeline["split"]  # balanced at the chosen micro size
        cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, pp_split=split))
    return cfg


def plan_and_choose(
    cfg: RootConfig, info: ModelInfo, budget: Budget | None
) -> tuple[RootConfig, Choice]:
    """The memory plan of a run and its auto choices: (the config the ranks run, the choice)."""
    blocks = len(info.blocks) if info.blocks is not None else 0
    shape = ModelShape(
        info.parameters,
        info.block_parameters,
        blocks,
        info.largest_parameter,
        info.parameter_sizes,
        info.trainable,
        info.block_trainable,
    )
    # one tensor-parallel rank's share; a pipeline rank's is planned from its stages
    planner = Planner(cfg, per_tp_rank(cfg, shape, info.tp_share))
    cfg = planner.cfg = planner.with_balanced_split()  # parallel.pp_split=null: the plan's
    choice = choose(planner, budget)
    return resolved(cfg, choice), choice


def require_planned(cfg: RootConfig) -> None:
    """A rank refuses a config whose auto keys were never resolved by a plan (config.yaml written
    by hand or by a tool that skipped `plan.config`): it would train another split."""
    if cfg.batch.auto or cfg.ac.policy == AcPolicy.auto:
        raise ConfigError(
            ["batch.micro_size", "ac"],
            "auto is chosen by the plan before launch, and this config was not planned.",
            "start it with `launch train` (or write the config returned as plan.config).",
        )
