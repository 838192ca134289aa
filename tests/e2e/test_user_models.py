"""`launch train` on models this project did not write: a `_target_` model and a transformers
model from a tiny config. Same loss curve for every split (dp x accumulation), bad models refused
before any rank trains (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import max_rel_diff, read_losses, run_launch

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]

COMMON = [
    "train",
    "train.steps=4",
    "batch.global_size=8",
    "model.seq_len=24",
    "data.eval_problems=4",
    "wandb.mode=disabled",
    "checkpoint.enabled=false",
    "train.device=cpu",
]
CUSTOM = ["model=custom", "model._target_=tests.fixtures.models.TinyLM", "+model.d_model=16"]


def test_custom_model_curve_equal_for_dp2_and_dp1(tmp_path: Path) -> None:
    curves = {}
    for name, split in {"dp1": ["batch.grad_accum=2"], "dp2": ["parallel.dp=2"]}.items():
        run_launch([*COMMON, *CUSTOM, *split, "ac=every_n"], tmp_path / name)
        curves[name] = read_losses(tmp_path / name)
    assert len(curves["dp1"]) == 4
    assert max_rel_diff(curves["dp2"], curves["dp1"]) < 1e-5
    text = (tmp_path / "dp2" / "config.yaml").read_text()
    assert "_target_: tests.fixtures.models.TinyLM" in text and "d_model: 16" in text


def test_hf_config_model_trains_with_fsdp_and_full_recompute(tmp_path: Path) -> None:
    """One rank (issue 43: two rank start-ups saved): this is `model=hf`, `engine=fsdp` and
    `ac=full` reaching an HF model through `launch`. The same Llama under FSDP2 with ac=full at
    dp=2 is a row of tests/multiproc/test_user_model_curves.py's grid, and it trains at dp=2
    under FSDP2 through `launch` in test_lora.py and test_harness.py."""
    pytest.importorskip("transformers")
    hf = ["model=hf", "model.config=tests/fixtures/tiny_llama.json"]
    run_launch([*COMMON, *hf, "engine=fsdp", "ac=full", "batch.micro_size=8"], tmp_path / "fsdp")
    run_launch([*COMMON, *hf, "batch.grad_accum=2"], tmp_path / "one")
    fsdp, one = read_losses(tmp_path / "fsdp"), read_losses(tmp_path / "one")
    assert len(fsdp) == 4 and max_rel_diff(fsdp, one) < 1e-5


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "model._target_=tests.fixtures.nope.Net",
            "model._target_: 'tests.fixtures.nope.Net' does not import",
        ),
        ("model._target_=tests.fixtures.models.NotLogits", "returned dict, not logits"),
        ("+model.vocab_size=100", "logits have 100 entries, but the data has target id"),
    ],
)
def test_bad_models_refused_before_training(tmp_path: Path, override: str, message: str) -> None:
    args = [*COMMON, *CUSTOM, override]
    if "NotLogits" in override:
        args.remove("+model.d_model=16")
    proc = run_launch(args, tmp_path / "run", check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr + proc.stdout
    assert "Error getting object" not in proc.stderr + proc.stdout  # Hydra's own lines, not ours
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
