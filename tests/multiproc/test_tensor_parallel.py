"""`launch train parallel.tp=2` (and dp=2 x tp=2) on real gloo ranks: the loss, the gradient norm
and the token count of every step equal one process's on the same global batches; counting
tokens per world rank instead of per data-parallel rank (the negative control) is caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import FAST, max_rel_diff, read_metrics, read_summary, run_launch
from tests.once import built_once

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]

STEPS = 8
# The built-in task (mostly padding: a wrong denominator shows), 8 sequences per step.
COMMON = ["train", f"train.steps={STEPS}", "batch.global_size=8", *FAST]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The reference: one process, the whole global batch at once."""
    path = built_once(tmp_path_factory, "tp-one-process", lambda p: run_launch(COMMON, p))
    return read_metrics(path)


def _curves(metrics: list[dict[str, Any]]) -> dict[str, list[float]]:
    return {key: [m[key] for m in metrics] for key in ("loss", "grad_norm", "tokens")}


def _assert_equal(run_dir: Path, reference: list[dict[str, Any]]) -> None:
    ours, theirs = _curves(read_metrics(run_dir)), _curves(reference)
    assert len(ours["loss"]) == STEPS
    assert ours["tokens"] == theirs["tokens"]  # each token counted once
    assert max_rel_diff(ours["loss"], theirs["loss"]) < 1e-5
    assert max_rel_diff(ours["grad_norm"], theirs["grad_norm"]) < 1e-5


def test_tp2_equals_one_process(tmp_path: Path, one_process: list[dict[str, Any]]) -> None:
    run_launch([*COMMON, "parallel.tp=2"], tmp_path)
    _assert_equal(tmp_path, one_process)
    summary = read_summary(tmp_path)
    assert (summary["world_size"], summary["dp"], summary["tp"]) == (2, 1, 2)


@pytest.mark.parametrize(
    "extra",
    [
        ["engine=fsdp"],  # FSDP2 over the dp dimension, sequence-parallel norms
        ["engine=ddp", "parallel.sequence_parallel=false"],  # replicas summed over dp
    ],
    ids=["fsdp_sp", "ddp_no_sp"],
)
def test_dp2_tp2_accumulation_and_recompute_equal_one_process(
    tmp_path: Path, one_process: list[dict[str, Any]], extra: list[str]
) -> None:
    split = ["parallel.dp=2", "parallel.tp=2", "batch.grad_accum=2", "ac=full"]
    run_launch([*COMMON, *split, *extra], tmp_path)
    _assert_equal(tmp_path, one_process)
    summary = read_summary(tmp_path)
    assert (summary["world_size"], summary["dp"], summary["tp"]) == (4, 2, 2)


def test_counting_tokens_per_world_rank_is_caught(
    tmp_path: Path, one_process: list[dict[str, Any]]
) -> None:
    """The negative control: every rank of a tp group adds its (shared) tokens."""
    broken = ["parallel.dp=2", "parallel.tp=2", "debug.broken_tp_count=true"]
    run_launch([*COMMON, *broken], tmp_path)
    ours, theirs = _curves(read_metrics(tmp_path)), _curves(one_process)
    assert ours["tokens"] == [2 * t for t in theirs["tokens"]]
    assert max_rel_diff(ours["grad_norm"], theirs["grad_norm"]) > 0.1
    with pytest.raises(AssertionError):
        _assert_equal(tmp_path, one_process)
