"""The memory plan's activations per pipeline rank against what the rank holds: each pp rank
meters the bytes autograd saves over a step of its schedule (launcher/parallel/pipeline_meter.py)
and summary.json sets the peak beside plan.json's figure for that rank. One launch per schedule,
on a 3-block model whose default split is unequal (balanced by the plan), also token-exact
against one process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import FAST, max_rel_diff, read_metrics, read_summary, run_launch

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]

THREE = [
    "train",
    "train.steps=3",
    "batch.global_size=8",
    *(o for o in FAST if not o.startswith("model.n_layer")),
    "model.n_layer=3",
]
TOLERANCE = 0.15


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    run_dir = tmp_path_factory.mktemp("three-blocks-one-process")
    run_launch(THREE, run_dir)
    return read_metrics(run_dir)


@pytest.mark.parametrize(
    ("schedule", "held"),
    [("gpipe", [4, 4]), ("1f1b", [2, 1])],  # grad_accum 4: all of them; 1F1B: pp - s
)
def test_each_rank_holds_the_activations_its_plan_says(
    tmp_path: Path, one_process: list[dict[str, Any]], schedule: str, held: list[int]
) -> None:
    pp = ["parallel.pp=2", "batch.grad_accum=4", f"parallel.pp_schedule={schedule}"]
    run_launch([*THREE, *pp], tmp_path)
    pipeline = read_summary(tmp_path)["pipeline"]
    plan = json.loads((tmp_path / "plan.json").read_text())["pipeline"]
    assert sorted(len(s["blocks"]) for s in pipeline["stages"]) == [1, 2]  # unequal, balanced
    assert [r["held_micro_batches"] for r in plan["ranks"]] == held
    for rank, stage in zip(pipeline["ranks"], pipeline["stages"], strict=True):
        planned, measured = rank["activation_bytes_planned"], rank["activation_bytes_measured"]
        assert planned == held[rank["pp_rank"]] * stage["activation_bytes"]
        assert abs(measured / planned - 1) < TOLERANCE, (schedule, rank)
    # the unequal stages train one process's numbers
    metrics = read_metrics(tmp_path)
    assert [m["tokens"] for m in metrics] == [m["tokens"] for m in one_process]
    for key in ("loss", "grad_norm"):
        assert max_rel_diff([m[key] for m in metrics], [m[key] for m in one_process]) < 1e-5
