"""summary.json's `pipeline` (parallel.pp > 1): each pipeline rank's saved activation bytes at its
schedule's peak, measured on the rank (launcher/parallel/pipeline_meter.py) beside the memory
plan's figure for that rank (plan.json's `pipeline.ranks`), and each stage's blocks."""

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
    mine = (ctx.pp_rank, pipeline.saved_peak_bytes)
    gathered: list[Any] = [None] * ctx.world_size if ctx.is_main else []
    dist.gather_object(mine, gathered if ctx.is_main else None, dst=0)
    if not ctx.is_main:
        return None
    measured: dict[int, int] = {}
    for pp_rank, saved in gathered:  # a stage's data-parallel ranks: the most any held
        if saved is not None:
            measured[pp_rank] = max(saved, measured.get(pp_rank, 0))
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
            }
        )
    if not ranks:  # a config written without a plan: the measurement alone
        ranks = [
            {"pp_rank": r, "activation_bytes_measured": b} for r, b in sorted(measured.items())
        ]
    stages = [
        {k: s[k] for k in ("stage", "pp_rank", "blocks", "activation_bytes") if k in s}
        for s in planned.get("stages", [])
    ]
    keys = ("schedule", "stages_per_rank", "split")
    schedule: dict[str, Any] = {k: planned[k] for k in keys if k in planned}
    return {**schedule, "stages": stages, "ranks": ranks}
