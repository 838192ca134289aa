"""The memory budget: where it comes from, and the error for a plan over it, which names the
largest part and the keys that would fix it, each with the peak it would give."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.ac import AcPolicy
from launcher.config.batch import divisors
from launcher.config.root import RootConfig
from launcher.engines import engine_spec
from launcher.errors import ConfigError
from launcher.memory.parts import FIXES, MemoryPlan
from launcher.memory.planner import Planner, with_dp


@dataclass(frozen=True)
class Budget:
    bytes: int
    source: str
    """In words: train.memory_budget=..., or the GPU's memory."""


def budget_for(explicit: int | None, text: str | None, machine: Budget | None) -> Budget | None:
    """train.memory_budget when given; else the machine's (launcher/memory/machine.py)."""
    if explicit is not None:
        return Budget(explicit, f"train.memory_budget={text}")
    return machine


def size(n: float) -> str:
    if n >= 2**30:
        return f"{n / 2**30:,.2f} GiB"
    return f"{n / 2**20:,.1f} MiB"


def divisors_below(n: int, below: int) -> list[int]:
    """The divisors of n under `below`, largest first."""
    return [d for d in reversed(divisors(n)) if d < below]


def _engine_variants(planner: Planner) -> list[tuple[str, RootConfig]]:
    """Configurations that shard more, then those that offload more (engine options)."""
    spec = engine_spec(planner.cfg.engine.name)
    return [*spec.leaner_variants(planner.cfg), *spec.offload_variants(planner.cfg)]


def fixes(planner: Planner, plan: MemoryPlan, budget: int) -> list[str]:
    """Each key that would bring the plan under the budget alone, with its peak; where no value
    of a key does, its best value and peak."""
    cfg, micro, policy = planner.cfg, plan.micro_size, AcPolicy(plan.ac)
    per_rank = cfg.split().global_size // cfg.parallel.dp
    found: list[str] = []
    for m in divisors_below(per_rank, micro):
        peak = planner.plan(m, policy).peak
        if peak <= budget or m == 1:
            fits = "" if peak <= budget else ", still over"
            found.append(f"batch.micro_size={m} (peak {size(peak)}{fits})")
            break
    others = [p for p in planner.policies() if p != policy]
    planner.probe(others)
    peaks = {p: planner.plan(micro, p).peak for p in others}
    fitting = [p for p in others if peaks[p] <= budget]
    best = fitting[0] if fitting else min(peaks, key=lambda p: peaks[p], default=None)
    if best is not None and peaks[best] < plan.peak:
        fits = "" if peaks[best] <= budget else ", still over"
        found.append(f"ac={best.value} (peak {size(peaks[best])}{fits})")
    for key, variant in _engine_variants(planner):
        peak = planner.plan(micro, policy, variant).peak
        if peak < plan.peak:
            fits = "" if peak <= budget else ", still over"
            found.append(f"{key} (peak {size(peak)}{fits})")
            if peak <= budget:
                break
    dp = cfg.parallel.dp * 2
    global_size = cfg.split().global_size
    shards = engine_spec(cfg.engine.name).shards_state(cfg)
    if global_size % (dp * micro) == 0 and shards:
        peak = planner.plan(micro, policy, with_dp(cfg, dp)).peak
        if peak < plan.peak:
            found.append(f"parallel.dp={dp} (peak {size(peak)}; batch.grad_accum follows)")
    return found


def smallest(planner: Planner) -> tuple[MemoryPlan, str]:
    """The smallest peak at this dp: one sequence per micro-batch, every granularity and
    sharding engine; with the keys that give it."""
    cfg = planner.cfg
    planner.probe(planner.policies())
    candidates: list[tuple[MemoryPlan, str]] = []
    engines = [("", cfg), *_engine_variants(planner)]
    for key, variant in engines:
        for policy in planner.policies():
            plan = planner.plan(1, policy, variant)
            keys = " ".join(k for k in ("batch.micro_size=1", f"ac={policy.value}", key) if k)
            candidates.append((plan, keys))
    return min(candidates, key=lambda c: c[0].peak)


def over_budget(planner: Planner, plan: MemoryPlan, budget: Budget, note: str = "") -> ConfigError:
    """The error for a plan over the budget (before anything is launched)."""
    largest = plan.largest
    parts = ", ".join(f"{name} {size(n)}" for name, n in plan.parts.items() if n)
    low, keys = smallest(planner)
    head = (
        f"the plan needs {size(plan.peak)} per rank, more than {budget.source} "
        f"({size(budget.bytes)}){note}. Largest part: {largest} {size(plan.parts[largest])} "
        f"(shrink it with {FIXES[largest]}); all parts: {parts}."
    )
    if low.peak > budget.bytes:
        return ConfigError(
            ["train.memory_budget", "parallel.dp", "batch.micro_size", "ac", "engine"],
            head + f" No split fits at parallel.dp={planner.cfg.parallel.dp}: the smallest "
            f"achievable peak is {size(low.peak)} ({keys}).",
            f"raise train.memory_budget to at least {size(low.peak)} with {keys}, or shard over "
            "more ranks (a larger parallel.dp with engine=fsdp or engine.zero_stage=3).",
        )
    found = fixes(planner, plan, budget.bytes)
    return ConfigError(
        ["batch.micro_size", "ac", "engine.zero_stage", "parallel.dp"],
        head,
        "change one of: " + "; ".join(found) + f" (smallest achievable: {size(low.peak)} with "
        f"{keys}), or set batch.micro_size=auto ac=auto to let the plan choose.",
    )
