"""`launch plan parallel.tp=2`: the mesh, and a rank's parameter, optimizer and activation bytes
divided by tp (norms whole), against tp=1; plan.json says dp, tp and the world."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.config import to_root_config
from launcher.config.ac import AcPolicy
from launcher.memory.planner import Planner
from launcher.models.shape import ModelShape
from tests.helpers import run_launch


def test_launch_plan_tp2_halves_the_parameter_bytes_per_rank(tmp_path: Path) -> None:

    parts = {}
    for tp in (1, 2):
        run_dir = tmp_path / f"tp{tp}"
        proc = run_launch(["plan", f"parallel.tp={tp}", "wandb.mode=disabled"], run_dir)
        plan = json.loads((run_dir / "plan.json").read_text())
        parts[tp] = plan["memory_plan"]["parts"]
        assert (plan["world_size"], plan["dp"], plan["tp"]) == (tp, 1, tp)
        if tp == 2:
            assert "mesh        (dp 1, tp 2)" in proc.stdout
    assert parts[2]["parameters"] <= 0.6 * parts[1]["parameters"]
    assert parts[2]["optimizer_state"] <= 0.6 * parts[1]["optimizer_state"]
    assert parts[2]["activations"] < parts[1]["activations"]


def test_auto_micro_size_fits_a_larger_micro_batch_per_rank_under_tp(tmp_path: Path) -> None:
    """batch.micro_size=auto plans with each rank's share: under a budget where dp=2 alone fits
    micro-batches of 16, dp=2 x tp=2 fits 32 (the same global batch)."""
    chosen = {}
    for tp in (1, 2):
        run_dir = tmp_path / f"tp{tp}"
        args = ["plan", "parallel.dp=2", f"parallel.tp={tp}", "batch.micro_size=auto"]
        budget = ["batch.global_size=64", "train.memory_budget=20MiB", "wandb.mode=disabled"]
        run_launch([*args, *budget], run_dir)
        plan = json.loads((run_dir / "plan.json").read_text())
        chosen[tp] = plan["micro_size"]
    assert chosen == {1: 16, 2: 32}


def test_auto_recompute_under_tp_never_picks_selective() -> None:
    """ac=auto chooses among the granularities a tp run can execute (selective cannot)."""
    shape = ModelShape(1000, 400, 2, 100)
    for tp, has_selective in ((1, True), (2, False)):
        cfg = to_root_config({"parallel": {"tp": tp}, "wandb": {"mode": "disabled"}})
        assert (AcPolicy.selective in Planner(cfg, shape).policies()) is has_selective
