"""`launch plan parallel.tp=2`: the mesh, and a rank's parameter, optimizer and activation bytes
divided by tp (norms whole), against tp=1; plan.json says dp, tp and the world."""

from __future__ import annotations

import json
from pathlib import Path

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
