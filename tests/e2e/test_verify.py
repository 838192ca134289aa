"""`launch verify` end to end: certified splits exit 0 (torchrun ranks with DDP and recompute, a
transformers model from a tiny config), the three known ways to train a different model exit 1
naming the cause, `launch train verify.first=true` refuses to start such a run, and a directory
where training started is refused. (A sweep's certificate rows: tests/unit/test_verify.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_launch

pytestmark = pytest.mark.e2e

SMALL = [
    "batch.global_size=8",
    "model.seq_len=24",
    "wandb.mode=disabled",
    "train.device=cpu",
]
GPT = [*SMALL, "model.n_layer=2", "model.d_model=32", "model.n_head=2"]


def verify(args: list[str], run_dir: Path, code: int) -> tuple[str, dict[str, Any]]:
    proc = run_launch(["verify", *args], run_dir, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == code, output
    return output, json.loads((run_dir / "verify.json").read_text())


@pytest.mark.multiproc
def test_dp2_ddp_with_recompute_is_certified(tmp_path: Path) -> None:
    args = [*GPT, "parallel.dp=2", "batch.grad_accum=2", "engine=ddp", "ac=full"]
    output, certificate = verify(args, tmp_path, 0)
    assert certificate["certified"] and "certified: this split trains the same model" in output
    assert certificate["split"] == {
        "global_size": 8, "micro_size": 2, "grad_accum": 2, "dp": 2, "engine": "ddp"
    }  # fmt: skip
    assert certificate["reference"]["dp"] == 1 and certificate["reference"]["micro_size"] == 8
    assert len(certificate["steps"]) == 3 and certificate["worst_parameter"]["gap"] <= 1e-5
    # The run directory as `launch plan` leaves it, the split's own beside it; torchrun ran the
    # verify worker on each rank.
    assert (tmp_path / "config.yaml").is_file() and (tmp_path / "plan.json").is_file()
    plan = json.loads((tmp_path / "verify" / "split" / "plan.json").read_text())
    assert plan["runner"] == "torchrun" and "launcher.verify.worker" in plan["command"]


def test_transformers_model_is_certified(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    hf = ["model=hf", "model.config=tests/fixtures/tiny_llama.json", "batch.grad_accum=4"]
    _, certificate = verify([*SMALL, *hf, "ac=selective"], tmp_path, 0)
    assert certificate["certified"] and certificate["policy"] == "selective"


def test_batchnorm_under_accumulation_fails_naming_batchnorm(tmp_path: Path) -> None:
    model = ["model=custom", "model._target_=tests.fixtures.verify_models.BatchNormLM"]
    output, certificate = verify(
        [*SMALL, *model, "batch.grad_accum=2", "verify.steps=2"], tmp_path, 1
    )
    assert certificate["findings"][0]["cause"] == "batch_dependent"
    assert "BatchNorm1d (bn)" in output and "bn.running_mean" in output


def test_a_non_deterministic_op_fails_saying_not_deterministic(tmp_path: Path) -> None:
    model = ["model=custom", "model._target_=tests.fixtures.verify_models.NoisyLM"]
    output, certificate = verify(
        [*SMALL, *model, "batch.grad_accum=2", "verify.steps=2"], tmp_path, 1
    )
    assert certificate["deterministic"] is False
    assert certificate["findings"][0]["cause"] == "deterministic"
    assert "the model is not deterministic" in output


def test_broken_normalization_fails_and_train_verify_first_refuses_to_start(
    tmp_path: Path,
) -> None:
    """The negative control through `launch train verify.first=true`: the same certificate as
    `launch verify` (verify_split), then no training."""
    args = ["train", *GPT, "batch.grad_accum=2", "debug.broken_normalization=true"]
    proc = run_launch([*args, "verify.first=true", "train.steps=3"], tmp_path, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    certificate = json.loads((tmp_path / "verify.json").read_text())
    worst = certificate["worst_parameter"]
    assert not certificate["certified"] and worst["gap"] > 1e-3
    assert f"NOT certified: the largest gap is {worst['name']}" in output
    assert certificate["findings"][0]["cause"] == "normalization"
    assert certificate["deterministic"] is True  # the reference agreed with itself
    assert "training was not started" in output
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_directory_where_training_started_is_refused(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    proc = run_launch(["verify", *GPT], tmp_path, check=False)
    assert proc.returncode == 2
    assert "holds a training run that has started (metrics.jsonl)" in proc.stderr
    written = {p.name for p in tmp_path.iterdir()}
    assert not written & {"config.yaml", "plan.json", "verify", "verify.json"}
