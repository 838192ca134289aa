"""The one-process reference the tensor- and pipeline-parallel tests compare against (built once
for both modules, with its export) and the comparison itself: every step logged once, each token
counted once, the loss and the gradient norm within 1e-5."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import FAST, max_rel_diff, read_metrics, run_launch
from tests.once import built_once

STEPS = 4
HALF = STEPS // 2
"""Where the runs that stop early stop, and one process's checkpoints: after steps HALF and STEPS
(4 steps, the same strength as 8 here: every step lies in the 20-step warm-up, and a 4-rank
DTensor step costs a third of a CPU-second per rank)."""
# The built-in task (mostly padding: a wrong denominator shows), 8 sequences per step.
COMMON = ["train", f"train.steps={STEPS}", "batch.global_size=8", *FAST]


def one_process_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, the whole global batch at once (one run for every module that asks); its
    checkpoints at steps HALF and STEPS, for the runs that stop after step HALF."""
    args = [*COMMON, f"checkpoint.every={HALF}"]
    return built_once(tmp_path_factory, "tp-one-process", lambda p: run_launch(args, p))


def reference_export(tmp_path_factory: pytest.TempPathFactory, step: int) -> Path:
    """`launch export` of the reference's step-`step` checkpoint (exported once per test run)."""
    checkpoint = one_process_reference(tmp_path_factory) / "checkpoints" / f"step_{step}"
    return built_once(
        tmp_path_factory,
        f"tp-one-process-export-{step}",
        lambda p: run_launch(["export", str(checkpoint), "--output", str(p)]),
        done="model.safetensors",
    )


def curves(metrics: list[dict[str, Any]]) -> dict[str, list[float]]:
    return {key: [m[key] for m in metrics] for key in ("loss", "grad_norm", "tokens")}


def assert_equal_steps(run_dir: Path, reference: list[dict[str, Any]], first: int = 0) -> None:
    """The run's steps first + 1..STEPS equal the reference's (first: the steps a run resumed in
    a directory of its own, train.resume=PATH, took from its checkpoint and does not log)."""
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(first + 1, STEPS + 1))  # each logged once
    ours, theirs = curves(metrics), curves(reference[first:])
    assert ours["tokens"] == theirs["tokens"]  # each token counted once
    assert max_rel_diff(ours["loss"], theirs["loss"]) < 1e-5
    assert max_rel_diff(ours["grad_norm"], theirs["grad_norm"]) < 1e-5
