"""The memory plan's activations per pipeline rank against what the rank holds: each pp rank
meters the bytes autograd saves over a step of its schedule (launcher/parallel/pipeline_meter.py)
and summary.json sets the peak beside plan.json's figure for that rank. One launch per schedule,
on a 3-block model whose default split is unequal (balanced by the plan), also token-exact
against one process, with the plan's bubble beside each rank's measured idle share. And three
virtual stages per rank through the interleaved schedule, its validation loss included."""

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
    # The bubble: the plan's (pp - 1) / (grad_accum + pp - 1) beside each rank's measured idle
    # share of steps 2-3; the last stage idles at least until the first stage's first forward.
    assert (pipeline["pp"], pipeline["schedule"]) == (2, schedule)
    assert pipeline["bubble_planned"] == plan["bubble"] == round(1 / 5, 4)
    assert pipeline["bubble_measured"] == pipeline["ranks"][-1]["bubble_measured"]
    assert 0 < pipeline["bubble_measured"] < 1
    assert all(0 <= r["bubble_measured"] < 1 for r in pipeline["ranks"])
    # every step's line (the last one flushed alone too) carries the last stage's idle share
    assert all(0 < m["pp_bubble"] < 1 for m in read_metrics(tmp_path))
    # the unequal stages train one process's numbers
    metrics = read_metrics(tmp_path)
    assert [m["tokens"] for m in metrics] == [m["tokens"] for m in one_process]
    for key in ("loss", "grad_norm"):
        assert max_rel_diff([m[key] for m in metrics], [m[key] for m in one_process]) < 1e-5


def test_three_virtual_stages_per_rank_equal_one_process(tmp_path: Path) -> None:
    """parallel.pp_stages_per_rank=3: six one-block stages, 0, 2, 4 on rank 0 and 1, 3, 5 on
    rank 1, through the interleaved schedule; one process's numbers, the held-out loss (after
    step 2 and the last) forward-only through the same schedule too, and the plan's interleaved
    figure an upper bound of what each rank holds."""
    six = [*(o for o in THREE if not o.startswith("model.n_layer")), "model.n_layer=6"]
    six += ["eval.every=2"]
    run_launch(six, tmp_path / "one")
    interleaved = ["parallel.pp_schedule=interleaved_1f1b", "parallel.pp_stages_per_rank=3"]
    run_launch([*six, "parallel.pp=2", "batch.grad_accum=2", *interleaved], tmp_path / "pp")
    pipeline = read_summary(tmp_path / "pp")["pipeline"]
    assert [r["stages"] for r in pipeline["ranks"]] == [[0, 2, 4], [1, 3, 5]]
    assert [s["blocks"] for s in pipeline["stages"]] == [[0], [1], [2], [3], [4], [5]]
    for rank in pipeline["ranks"]:
        assert 0 < rank["activation_bytes_measured"] <= rank["activation_bytes_planned"]
    ours, theirs = read_metrics(tmp_path / "pp"), read_metrics(tmp_path / "one")
    assert [m["tokens"] for m in ours] == [m["tokens"] for m in theirs]
    for key in ("loss", "grad_norm"):
        assert max_rel_diff([m[key] for m in ours], [m[key] for m in theirs]) < 1e-5
    val = {m["step"]: m["val_loss"] for m in ours if m.get("val_loss")}
    expected = {m["step"]: m["val_loss"] for m in theirs if m.get("val_loss")}
    assert sorted(val) == sorted(expected) == [2, 3]
    assert max_rel_diff([val[2], val[3]], [expected[2], expected[3]]) < 1e-5
