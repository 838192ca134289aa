"""Plans of a configuration and of its variants (micro size, granularity, engine, dp): what the
budget check, its error's fixes and the automatic split compare. Activations are probed once per
granularity (launcher/memory/probe.py) and reused for every micro size and engine."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from launcher.config.ac import AcPolicy
from launcher.config.model import ModelConfig
from launcher.config.root import RootConfig
from launcher.memory.parts import MemoryPlan, plan_memory
from launcher.memory.probe import ActivationLine, probe_activations
from launcher.memory.stages import balanced_split, plan_stages, without_a_block
from launcher.models.shape import ModelShape

GENERIC_FLOPS = {
    AcPolicy.none: 1.0,
    AcPolicy.selective: 1.02,
    AcPolicy.every_n: 1.17,
    AcPolicy.sqrt: 1.33,
    AcPolicy.full: 1.33,
}
"""Training FLOPs over no recompute, for a model whose shape the launcher does not know: full
recompute reruns the forward (a third of the step); every_n half of it; selective only cheap ops."""

COST_ORDER = [AcPolicy.none, AcPolicy.selective, AcPolicy.every_n, AcPolicy.sqrt, AcPolicy.full]
"""Granularities from the least recompute to the most (sqrt and full rerun every block; full
keeps less at its peak, so it comes last as the smallest)."""


def with_dp(cfg: RootConfig, dp: int) -> RootConfig:
    """`cfg` at `dp` ranks and the same global batch (batch.grad_accum derived again: plan it
    at a micro size that divides the new per-rank batch)."""
    parallel = dataclasses.replace(cfg.parallel, dp=dp, nodes=1)
    batch = dataclasses.replace(cfg.batch, global_size=cfg.split().global_size, grad_accum=None)
    return dataclasses.replace(cfg, parallel=parallel, batch=batch)


@dataclass
class Planner:
    """Plans for one model; `cfg` is the request (micro size and policy may be auto)."""

    cfg: RootConfig
    shape: ModelShape
    lines: dict[AcPolicy, ActivationLine] = field(default_factory=dict)
    less_one: dict[AcPolicy, ActivationLine] = field(default_factory=dict)
    """parallel.pp > 1: the probe of the model less one block (launcher/memory/stages.py)."""

    def line(self, policy: AcPolicy) -> ActivationLine:
        if policy not in self.lines:
            self.lines.update(probe_activations(self.cfg, [policy]))
        return self.lines[policy]

    def block_line(self, policy: AcPolicy) -> ActivationLine:
        if policy not in self.less_one:
            self.less_one.update(probe_activations(without_a_block(self.cfg), [policy]))
        return self.less_one[policy]

    def with_balanced_split(self) -> RootConfig:
        """The request with parallel.pp_split resolved (pp > 1 and null: balanced by the plan's
        costs); the request itself otherwise. Micro size and policy are given under pp."""
        cfg = self.cfg
        if cfg.parallel.pp == 1 or cfg.parallel.pp_split is not None or cfg.batch.auto:
            return cfg  # batch.micro_size=auto: balanced at each candidate micro size (plan)
        return self._balanced(cfg, cfg.split().micro_size, cfg.ac.policy)

    def _balanced(self, cfg: RootConfig, micro: int, policy: AcPolicy) -> RootConfig:
        starts = balanced_split(cfg, self.shape, self.line(policy), self.block_line(policy), micro)
        return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, pp_split=starts))

    def probe(self, policies: list[AcPolicy]) -> None:
        missing = [p for p in policies if p not in self.lines]
        if missing:
            self.lines.update(probe_activations(self.cfg, missing))

    def plan(self, micro_size: int, policy: AcPolicy, cfg: RootConfig | None = None) -> MemoryPlan:
        cfg = cfg or self.cfg
        ac = dataclasses.replace(cfg.ac, policy=policy)
        cfg = dataclasses.replace(cfg, ac=ac)
        if cfg.parallel.pp > 1:  # per pipeline rank, from its stages
            if cfg.parallel.pp_split is None:
                cfg = self._balanced(cfg, micro_size, policy)
            whole, less_one = self.line(policy), self.block_line(policy)
            return plan_stages(cfg, self.shape, whole, less_one, micro_size)
        return plan_memory(cfg, self.shape, self.line(policy), micro_size)

    def flops_ratio(self, policy: AcPolicy) -> float:
        if isinstance(self.cfg.model, ModelConfig):
            from launcher.recompute.estimate import estimate_activations

            ac = dataclasses.replace(self.cfg.ac, policy=policy)
            cfg = dataclasses.replace(self.cfg, ac=ac)
            return estimate_activations(cfg, 1, policy).recompute_flops_ratio
        return GENERIC_FLOPS[policy]

    def policies(self) -> list[AcPolicy]:
        """The granularities this model can run, cheapest first (all need blocks but none)."""
        if self.shape.n_blocks == 0:
            return [AcPolicy.none]
        if self.cfg.parallel.tp > 1:  # the selective op policy does not run on DTensors
            return [p for p in COST_ORDER if p != AcPolicy.selective]
        return list(COST_ORDER)
