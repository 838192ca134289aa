"""The memory plan end to end (issue 14): the table and plan.json, the automatic split that fits a
budget and trains the same curve, and an impossible budget refused before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import FAST, max_rel_diff, read_losses, read_metrics, read_summary, run_launch

pytestmark = pytest.mark.e2e

RUN = [*FAST, "train.steps=4", "batch.global_size=32", "checkpoint.enabled=false"]


def test_plan_prints_the_parts_and_auto_writes_what_the_ranks_run(tmp_path: Path) -> None:
    out = run_launch(
        ["plan", *RUN, "batch.micro_size=auto", "ac=auto", "train.memory_budget=6MiB"], tmp_path
    ).stdout
    assert "planned peak" in out and "activations by fake tensors" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert set(plan["memory_plan"]["parts"]) >= {"parameters", "optimizer_state", "activations"}
    assert plan["planned_peak_bytes"] == sum(plan["memory_plan"]["parts"].values())
    assert plan["planned_peak_bytes"] <= 6 * 2**20
    choice = plan["memory_choice"]
    assert choice["requested"] == {"batch.micro_size": "auto", "ac": "auto"}
    assert f"batch.micro_size={choice['micro_size']}" in out
    config = (tmp_path / "config.yaml").read_text()
    assert f"micro_size: {choice['micro_size']}" in config
    assert f"policy: {choice['ac']}" in config and "policy: auto" not in config
    assert plan["micro_size"] * plan["grad_accum"] == 32


def test_auto_micro_size_fits_a_budget_and_trains_the_unsplit_curve(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    # Subprocesses: the CPU meter counts every live tensor of its process (a test process holds
    # other tests' tensors) and peak_rss_bytes is the process's high-water mark.
    run_launch(["train", *RUN, "batch.micro_size=32"], whole, in_process=False)
    peak = read_summary(whole)["peak_memory_bytes"]
    budget = int(peak * 0.6)
    auto = tmp_path / "auto"
    auto_args = ["train", *RUN, "batch.micro_size=auto", f"train.memory_budget={budget}"]
    run_launch(auto_args, auto, in_process=False)
    summary = read_summary(auto)
    assert summary["micro_size"] < 32 and summary["grad_accum"] == 32 // summary["micro_size"]
    assert summary["peak_memory_bytes"] <= budget  # measured, not only planned
    assert abs(summary["peak_memory_bytes"] / summary["planned_peak_bytes"] - 1) < 0.15
    assert summary["peak_rss_bytes"] > summary["peak_memory_bytes"]
    assert read_metrics(auto)[-1]["peak_memory_bytes"] == summary["peak_memory_bytes"]
    assert max_rel_diff(read_losses(auto), read_losses(whole)) < 1e-5


def test_an_impossible_budget_is_refused_before_anything_starts(tmp_path: Path) -> None:
    done = run_launch(
        ["train", *RUN, "batch.micro_size=auto", "train.memory_budget=64KiB"], tmp_path, check=False
    )
    assert done.returncode == 2
    assert "smallest achievable peak is" in done.stderr and "train.memory_budget" in done.stderr
    assert not (tmp_path / "config.yaml").exists()


@pytest.mark.parametrize(
    "split",
    [
        # FSDP2 with accumulation keeps every unit's whole unsharded fp32 gradient from the first
        # micro-batch to the last one's backward (issue 33: planned 17% low when only the shard
        # was counted).
        ["engine=fsdp", "ac=full", "batch.grad_accum=2"],
    ],
)
def test_the_plan_is_within_the_documented_error_of_the_measured_peak(
    split: list[str], tmp_path: Path
) -> None:
    """docs/memory.md#accuracy: within 8% on CPU at dp=2 (the benchmark's other points are in
    benchmarks/RESULTS.md); the ranks are processes of their own, measured by themselves."""
    args = [*FAST, "train.steps=2", "batch.global_size=8", "checkpoint.enabled=false"]
    run_launch(["train", *args, "parallel.dp=2", "data.eval_problems=1", *split], tmp_path)
    summary = read_summary(tmp_path)
    error = summary["planned_peak_bytes"] / summary["peak_memory_bytes"] - 1
    assert abs(error) < 0.08, (error, summary["planned_peak_bytes"], summary["peak_memory_bytes"])
