"""summary.json's `pipeline` (parallel.pp > 1): each pipeline rank's saved activation bytes at its
schedule's peak, measured on the rank (launcher/parallel/pipeline_meter.py) beside the memory
plan's figure for that rank (plan.json's `pipeline.ranks`), each stage's blocks, and the bubble:
the plan's analytic share beside each rank's measured idle share of a step
(launcher/parallel/pipeline_clock.py), the last stage's rank's as the pipeline's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch.distributed as dist

from launcher.distributed import DistContext
from launcher.parallel.pipeline_schedule import PipelineRunner
from launcher.rundir import PLAN_FILE


def planned_pipeline(run_dir: Path) -> dict[str, Any]:
    """plan.json's `pipeline` ({} when the run directory has no plan of one)."""
    try:
        plan = json.loads((run_dir / PLAN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    found = plan.get("pipeline") if isinstance(plan, dict) else None
    return found if isinstance(found, dict) else {}


def pipeline_summary(
    ctx: DistContext, pipeline: PipelineRunner | None, run_dir: Path
) -> dict[str, Any] | None:
    """The measured and planned activation bytes per pipeline rank, on rank 0 (None elsewhere
    and without a pipeline). Collective over the job: every rank of a pipeline calls it."""
    if pipeline is None:
        return None
    mine = (ctx.pp_rank, pipeline.saved_peak_bytes, pipeline.bubble_measured)
    gathered: list[Any] = [None] * ctx.world_size if ctx.is_main else []
    dist.gather_object(mine, gathered if ctx.is_main else None, dst=0)
    if not ctx.is_main:
        return None
    measured: dict[int, int] = {}
    idle: dict[int, list[float]] = {}
    for pp_rank, saved, bubble in gathered:  # a stage's data-parallel ranks: the most any held
        if saved is not None:
            measured[pp_rank] = max(saved, measured.get(pp_rank, 0))
        if bubble is not None:
            idle.setdefault(pp_rank, []).append(bubble)
    bubbles = {r: round(sum(b) / len(b), 4) for r, b in idle.items()}  # mean over replicas
    planned = planned_pipeline(run_dir)
    ranks = []
    for rank in planned.get("ranks", []):
        r = rank["pp_rank"]
        ranks.append(
            {
                "pp_rank": r,
                "stages": rank["stages"],
                "activation_bytes_planned": rank["activation_bytes"],
                "activation_bytes_measured": measured.get(r),
                "bubble_measured": bubbles.get(r),
            }
        )
    if not ranks:  # a config written without a plan: the measurement alone
        ranks = [
            {"pp_rank": r, "activation_bytes_measured": b, "bubble_measured": bubbles.get(r)}
            for r, b in sorted(measured.items())
        ]
    stages = [
        {k: s[k] for k in ("stage", "pp_rank", "blocks", "activation_bytes") if k in s}
        for s in planned.get("stages", [])
    ]
    keys = ("schedule", "stages_per_rank", "split")
    schedule: dict[str, Any] = {k: planned[k] for k in keys if k in planned}
    last = max(bubbles, default=None)  # the last stage's rank: idle in the fill, busy in the drain
    bubble = {
        "bubble_planned": planned.get("bubble"),
        "bubble_measured": bubbles.get(last) if last is not None else None,
    }
    return {"pp": ctx.pp, **schedule, **bubble, "stages": stages, "ranks": ranks}
