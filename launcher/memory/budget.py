"""The memory budget: where it comes from, and the error for a plan over it, which names the
largest part and the keys that would fix it, each with the peak it would give."""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.config.ac import AcPolicy
from launcher.config.batch import divisors
from launcher.config.root import RootConfig
from launcher.config.train import parse_size
from launcher.engines import engine_spec
from launcher.errors import ConfigError
from launcher.memory.parts import MemoryPlan
from launcher.memory.planner import Planner, with_dp

SAFETY_MARGIN = 0.10
"""Fraction of the budget an automatic choice leaves free (allocator slack, the framework)."""


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


def usable(budget: int, margin: float) -> int:
    """What a plan may fill of `budget` bytes when `margin` of it is kept free."""
    return budget if not margin else int(budget * (1 - margin))


def budget_text(peak: int, margin: float) -> str:
    """The smallest train.memory_budget, as a value to type (0.1 MiB or 0.01 GiB steps, rounded
    up), whose usable part (less `margin`) holds `peak` bytes."""
    need = peak if not margin else math.ceil(peak / (1 - margin))
    unit, step = ("GiB", 0.01) if need >= 2**30 else ("MiB", 0.1)
    scale = 2**30 if unit == "GiB" else 2**20
    value = math.ceil(need / scale / step - 1e-9) * step
    while True:  # parse_size truncates to whole bytes: step up until the value holds the peak
        text = f"{value:.{2 if unit == 'GiB' else 1}f}{unit}"
        if usable(parse_size("train.memory_budget", text), margin) >= peak:
            return text
        value += step


def divisors_below(n: int, below: int) -> list[int]:
    """The divisors of n under `below`, largest first."""
    return [d for d in reversed(divisors(n)) if d < below]


def _engine_variants(planner: Planner) -> list[tuple[str, RootConfig]]:
    """Configurations that shard more, then those that offload more (engine options)."""
    spec = engine_spec(planner.cfg.engine.name)
    return [*spec.leaner_variants(planner.cfg), *spec.offload_variants(planner.cfg)]


def _shrinks(planner: Planner, plan: MemoryPlan, variant: RootConfig, part: str) -> bool:
    policy = AcPolicy(plan.ac)
    return planner.plan(plan.micro_size, policy, variant).parts[part] < plan.parts[part]


def _larger_dp(planner: Planner, plan: MemoryPlan, variant: RootConfig) -> RootConfig | None:
    """`variant` at twice the ranks, when the global batch splits so at this micro size."""
    dp = variant.parallel.dp * 2
    if planner.cfg.split().global_size % (dp * plan.micro_size):
        return None
    return with_dp(variant, dp)


def shrink_advice(planner: Planner, plan: MemoryPlan) -> str:
    """What shrinks the plan's largest part: only configurations that differ from this one (the
    engine's leaner and offload variants, a larger parallel.dp where it shards) and that were
    planned to make that part smaller."""
    cfg, part = planner.cfg, plan.largest
    if part == "activations":
        found = []
        if plan.micro_size > 1:
            found.append("a smaller batch.micro_size")
        policy = AcPolicy(plan.ac)
        others = [p for p in planner.policies() if p != policy]
        planner.probe(others)
        smaller = [
            f"ac={p.value}"
            for p in others
            if planner.plan(plan.micro_size, p).parts[part] < plan.parts[part]
        ]
        if smaller:
            found.append(f"a recompute policy ({', '.join(smaller)})")
        return " or ".join(found)
    found = [
        key for key, variant in _engine_variants(planner) if _shrinks(planner, plan, variant, part)
    ]
    spec = engine_spec(cfg.engine.name)
    wider = _larger_dp(planner, plan, cfg)
    if wider is not None and _shrinks(planner, plan, wider, part):
        found.append("a larger parallel.dp")
    elif wider is not None and not found:
        sharding = [
            key
            for key, variant in spec.leaner_variants(cfg)
            if (w := _larger_dp(planner, plan, variant)) is not None
            and planner.plan(plan.micro_size, AcPolicy(plan.ac), w).parts[part]
            < planner.plan(plan.micro_size, AcPolicy(plan.ac), variant).parts[part]
        ]
        if sharding:
            found.append(f"a larger parallel.dp with {' or '.join(sharding)}")
    extra = spec.buffer_advice(cfg) if part == "comm_buffers" else None
    found += [extra] if extra else []
    return " or ".join(found)


def micro_keys(cfg: RootConfig, micro: int | str) -> str:
    """The overrides that give micro-batches of `micro` (or auto) at the request's global batch,
    whichever two of the batch keys the request set."""
    keys = [f"batch.micro_size={micro}"]
    if cfg.batch.grad_accum is not None:
        keys.append("batch.grad_accum=null")
    if cfg.batch.global_size is None:
        keys.append(f"batch.global_size={cfg.split().global_size}")
    return " ".join(keys)


def dp_keys(cfg: RootConfig, dp: int, micro: int) -> str:
    """The overrides that give `dp` ranks at the request's global batch and micro size."""
    if cfg.batch.grad_accum is None and cfg.batch.global_size is not None:
        return f"parallel.dp={dp}"  # the micro size given or chosen stays, grad_accum follows
    return f"parallel.dp={dp} {micro_keys(cfg, micro)}"


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
            found.append(f"{micro_keys(cfg, m)} (peak {size(peak)}{fits})")
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
            fits = "" if peak <= budget else ", still over"
            found.append(f"{dp_keys(cfg, dp, micro)} (peak {size(peak)}{fits})")
    return found


def smallest(planner: Planner) -> tuple[MemoryPlan, str]:
    """The smallest peak at this dp over every micro size (accumulation is not free: FSDP2 holds
    whole gradients while it accumulates), granularity and engine variant; with the keys that
    give it."""
    cfg = planner.cfg
    planner.probe(planner.policies())
    per_rank = cfg.split().global_size // cfg.parallel.dp
    candidates: list[tuple[MemoryPlan, str]] = []
    engines = [("", cfg), *_engine_variants(planner)]
    for key, variant in engines:
        for policy in planner.policies():
            for micro in divisors(per_rank):
                plan = planner.plan(micro, policy, variant)
                keys = f"{micro_keys(cfg, micro)} ac={policy.value}" + (f" {key}" if key else "")
                candidates.append((plan, keys))
    return min(candidates, key=lambda c: c[0].peak)


def _more_ranks(cfg: RootConfig) -> str:
    """The way out at a larger dp, in words: the engine's own sharding, or the leaner ones'."""
    spec = engine_spec(cfg.engine.name)
    if spec.shards_state(cfg):
        return "a larger parallel.dp"
    sharding = [
        key for key, v in spec.leaner_variants(cfg) if engine_spec(v.engine.name).shards_state(v)
    ]
    return f"a larger parallel.dp with {' or '.join(sharding)}" if sharding else ""


def over_budget(
    planner: Planner, plan: MemoryPlan, budget: Budget, margin: float = 0.0
) -> ConfigError:
    """The error for a plan over the budget (before anything is launched). `margin`: the part of
    the budget kept free (an automatic choice's), which every figure offered here keeps too."""
    largest = plan.largest
    parts = ", ".join(f"{name} {size(n)}" for name, n in plan.parts.items() if n)
    low, keys = smallest(planner)
    target = usable(budget.bytes, margin)
    note = f" (less the {margin:.0%} margin an automatic choice keeps)" if margin else ""
    shrink = shrink_advice(planner, plan)
    advice = f"shrink it with {shrink}" if shrink else "no other split or engine option shrinks it"
    head = (
        f"the plan needs {size(plan.peak)} per rank, more than {budget.source} "
        f"({size(budget.bytes)}){note}. Largest part: {largest} {size(plan.parts[largest])} "
        f"({advice}); all parts: {parts}."
    )
    if low.peak > target:
        wider = _more_ranks(planner.cfg)
        return ConfigError(
            ["train.memory_budget", "parallel.dp", "batch.micro_size", "ac", "engine"],
            head + f" No split fits at parallel.dp={planner.cfg.parallel.dp}: the smallest "
            f"achievable peak is {size(low.peak)} ({keys}).",
            f"set train.memory_budget={budget_text(low.peak, margin)} with {keys}"
            + (f", or shard over more ranks ({wider})." if wider else "."),
        )
    found = fixes(planner, plan, target)
    auto = ""
    if auto_fits(planner, budget.bytes):
        auto = f", or set {micro_keys(planner.cfg, 'auto')} ac=auto to let the plan choose"
    return ConfigError(
        ["batch.micro_size", "ac", "engine.zero_stage", "parallel.dp"],
        head,
        "change one of: " + "; ".join(found) + f"; or all of: {keys} (the smallest achievable "
        f"peak, {size(low.peak)}){auto}.",
    )


def auto_fits(planner: Planner, budget: int) -> bool:
    """Whether batch.micro_size=auto ac=auto would find a split within `budget` less the margin
    it keeps (launcher/memory/auto.py tries these: every micro size and granularity at the
    request's engine, then its offload variants)."""
    cfg = planner.cfg
    per_rank = cfg.split().global_size // cfg.parallel.dp
    variants = [cfg, *(v for _, v in engine_spec(cfg.engine.name).offload_variants(cfg))]
    target = usable(budget, SAFETY_MARGIN)
    return any(
        planner.plan(micro, policy, variant).peak <= target
        for variant in variants
        for policy in planner.policies()
        for micro in divisors(per_rank)
    )
