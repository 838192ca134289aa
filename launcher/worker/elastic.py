"""An elastic job (parallel.min_nodes < parallel.nodes) on the world its rendezvous gave it.

At every (re)start each rank derives the split for the ranks it got: the same ranks per node, the
same global batch and micro-batch, more accumulation on fewer ranks (RootConfig.on_nodes). The
checkpoint then loads into that split exactly (launcher/checkpoint/resume.py), and rank 0 says in
one line what changed, with a record in events.jsonl:
`restarted on 1 node (dp 2 -> 1, grad_accum 1 -> 2), from step 6`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.config.root import RootConfig
from launcher.distributed import DistContext, check_world_size
from launcher.events import record_event
from launcher.logs import get_logger
from launcher.tracking.run_end import last_logged_step
from launcher.worker.stop import requeued_by_slurm, restart_attempt, torchrun_restarts

if TYPE_CHECKING:
    from launcher.checkpoint.resume import ResumeState

log = get_logger("elastic")
LOST_NODES_ENV = "LAUNCHER_LOST_NODES"
"""Set by train.sbatch for a relaunched step: the nodes SLURM removed from the job."""


def config_for_world(cfg: RootConfig, ctx: DistContext) -> RootConfig:
    """The config for the ranks this job has: itself, or (elastic) the split on fewer nodes."""
    parallel = cfg.parallel
    per_node = parallel.ranks_per_node
    if parallel.elastic and ctx.world_size != parallel.world and ctx.world_size % per_node == 0:
        nodes = ctx.world_size // per_node
        if parallel.least_nodes <= nodes <= parallel.nodes:
            return cfg.on_nodes(nodes)
    check_world_size(ctx, parallel.dp, parallel.nodes, parallel.tp, parallel.pp)
    return cfg


def announce_restart(
    planned: RootConfig,
    cfg: RootConfig,
    run_dir: Path,
    ctx: DistContext,
    resumed: ResumeState | None,
) -> dict[str, Any] | None:
    """Rank 0, before metrics.jsonl is rewound: one line and one record when this is a restart
    (torchrun's or a SLURM requeue) or the job runs on fewer nodes than planned."""
    restarted = restart_attempt() > 0 or requeued_by_slurm()
    if not ctx.is_main or not (restarted or cfg.parallel.nodes != planned.parallel.nodes):
        return None
    split = cfg.split()
    before = resumed.checkpoint.meta.get("split", {}) if resumed is not None else {}
    dp0 = int(before.get("dp", planned.split().dp))
    accum0 = int(before.get("grad_accum", planned.split().grad_accum))
    step = resumed.step if resumed is not None else 0
    redone = max(0, last_logged_step(run_dir) - step)
    nodes = cfg.parallel.nodes
    changes = (
        f"dp {dp0} -> {split.dp}, grad_accum {accum0} -> {split.grad_accum}"
        if (dp0, accum0) != (split.dp, split.grad_accum)
        else f"dp {split.dp}, grad_accum {split.grad_accum}"
    )
    where = f"from step {step}" if resumed is not None else "from the start"
    # train.sbatch names the nodes SLURM removed from the job before it ran the step again (a
    # later torchrun restart in that step has another cause).
    lost = os.environ.get(LOST_NODES_ENV, "") if torchrun_restarts() == 0 else ""
    verb = "restarted" if restarted else "started"
    log.warning(
        f"{verb} on {nodes} node{'s' if nodes != 1 else ''} ({changes}), {where}"
        + (f"; {redone} step(s) redone" if redone else "")
        + (f"; lost node(s): {lost}" if lost else "")
    )
    return record_event(
        run_dir,
        "restart" if restarted else "elastic",
        attempt=restart_attempt(),
        requeued=requeued_by_slurm(),
        nodes=nodes,
        planned_nodes=planned.parallel.nodes,
        dp=split.dp,
        grad_accum=split.grad_accum,
        micro_size=split.micro_size,
        previous={"dp": dp0, "grad_accum": accum0},
        from_step=step,
        steps_redone=redone,
        **({"lost_nodes": lost.split(",")} if lost else {}),
    )
