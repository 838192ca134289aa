"""The user's own model split by model.tp_plan, on real gloo ranks: dp=2 x tp=2 with FSDP2,
accumulation and recompute trains the loss, the gradient norm and the token count of one
process on the same global batches (a model whose heads are reshaped with -1, its head tied to
the embedding). The negative control: a fused [q; k; v] layer cut with chunk, split colwise,
has every shape right and the numbers wrong, and the test sees it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.tp_models import PLAN, plan_override
from tests.helpers import max_rel_diff, read_metrics, read_summary, run_launch

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]

STEPS = 4
COMMON = [
    "train",
    f"train.steps={STEPS}",
    "batch.global_size=8",
    "data.eval_problems=16",
    "wandb.mode=disabled",
    "model=custom",
    "model._target_=tests.fixtures.tp_models.HeadsLM",
    "model.seq_len=32",
    plan_override(PLAN),
]


def _curves(run_dir: Path) -> dict[str, list[float]]:
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    return {key: [m[key] for m in metrics] for key in ("loss", "grad_norm", "tokens")}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    run_dir = tmp_path_factory.mktemp("user-tp-one")
    run_launch(COMMON, run_dir)
    return _curves(run_dir)


def _assert_equal(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert ours["tokens"] == theirs["tokens"]  # each token counted once
    assert max_rel_diff(ours["loss"], theirs["loss"]) < 1e-5
    assert max_rel_diff(ours["grad_norm"], theirs["grad_norm"]) < 1e-5


def test_dp2_tp2_of_a_users_plan_equals_one_process(
    tmp_path: Path, one_process: dict[str, list[float]]
) -> None:
    split = ["parallel.dp=2", "parallel.tp=2", "engine=fsdp", "batch.grad_accum=2", "ac=full"]
    proc = run_launch([*COMMON, *split], tmp_path)
    _assert_equal(_curves(tmp_path), one_process)
    summary = read_summary(tmp_path)
    assert (summary["world_size"], summary["dp"], summary["tp"]) == (4, 2, 2)
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_fused_qkv_cut_with_chunk_is_caught(tmp_path: Path) -> None:
    """The model's mistake the plan cannot see: one [q; k; v] layer split colwise gives rank 0
    all of q and half of k. Its curve is not one process's."""
    plan = {**PLAN, "blocks.*.attn.qkv": "colwise"}
    plan = {k: v for k, v in plan.items() if k not in {f"blocks.*.attn.{x}" for x in "qkv"}}
    fused = [*COMMON[:-1], "+model.fused=true", plan_override(plan)]
    run_launch(fused, tmp_path / "one")
    run_launch([*fused, "parallel.tp=2"], tmp_path / "tp")
    ours, theirs = _curves(tmp_path / "tp"), _curves(tmp_path / "one")
    assert ours["tokens"] == theirs["tokens"]
    assert max_rel_diff(ours["loss"], theirs["loss"]) > 1e-3
    with pytest.raises(AssertionError):
        _assert_equal(ours, theirs)
