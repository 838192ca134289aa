"""The memory plan of a run's split (the auto choices made, checked against the budget) and of
each size an elastic job may run at: the parts of `launch plan` that size the run to the memory."""

from __future__ import annotations

from launcher.config.root import RootConfig
from launcher.engines import engine_spec
from launcher.errors import ConfigError
from launcher.memory.auto import Choice, plan_and_choose
from launcher.memory.budget import Budget, budget_for
from launcher.memory.machine import machine_budget
from launcher.models.probe import ModelInfo
from launcher.runners.base import Runner


def memory_budget(cfg: RootConfig, runner: Runner) -> Budget | None:
    """train.memory_budget; else the ranks' share of the memory they train in, as the runner
    knows it (a GPU's; on CPU this machine's RAM or a SLURM node's cluster.mem); else none."""
    return budget_for(
        cfg.train.memory_budget_bytes,
        cfg.train.memory_budget,
        machine_budget(runner.machine_memory(cfg)),
    )


def plan_split(
    cfg: RootConfig, info: ModelInfo, runner: Runner, budget: Budget | None = None
) -> tuple[RootConfig, Choice]:
    """The memory plan of the run, the auto choices made: (the config the ranks run, the
    choice); over the budget, a ConfigError naming the largest part and the fixes."""
    return plan_and_choose(cfg, info, budget or memory_budget(cfg, runner))


def elastic_splits(
    cfg: RootConfig, info: ModelInfo, runner: Runner, budget: Budget | None
) -> list[dict[str, int]]:
    """An elastic job: the split and the memory plan on every allowed number of nodes (the same
    global batch and micro-batch; a size that cannot hold them, or whose plan does not fit, is a
    ConfigError naming it)."""
    parallel = cfg.parallel
    if not parallel.elastic:
        return []
    spec = engine_spec(cfg.engine.name)
    if not spec.reshardable:
        raise ConfigError(
            ["parallel.min_nodes", "engine"],
            f"an elastic job resumes its checkpoints on fewer ranks, and {spec.label} cannot "
            f"({spec.reshard_note}).",
            "use engine=ddp or engine=fsdp, or drop parallel.min_nodes.",
        )
    cfg.check_elastic()
    sizes = []
    for nodes in range(parallel.least_nodes, parallel.nodes + 1):
        on_nodes = cfg.on_nodes(nodes)
        try:
            planned, choice = plan_split(on_nodes, info, runner, budget)
        except ConfigError as exc:
            raise ConfigError(
                ["parallel.min_nodes", *exc.keys],
                f"on {nodes} node(s): {exc.problem}",
                f"set parallel.min_nodes={nodes + 1}, or {exc.fix}",
            ) from None
        split = planned.split()
        peak = choice.plan.peak
        sizes.append(
            {
                "nodes": nodes,
                "dp": split.dp,
                "grad_accum": split.grad_accum,
                "micro_size": split.micro_size,
                "planned_peak_bytes": peak,
            }
        )
    return sizes
