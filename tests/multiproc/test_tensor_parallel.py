"""`launch train parallel.tp=2` (and dp=2 x tp=2) on real gloo ranks: the loss, the gradient norm
and the token count of every step equal one process's on the same global batches; counting
tokens per world rank instead of per data-parallel rank (the negative control) is caught. The tp
run's checkpoint exports and generates as one process's does, and resumes on dp=2 without tp."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import FAST, max_rel_diff, read_metrics, read_summary, run_launch
from tests.multiproc.one_process import (
    COMMON,
    HALF,
    STEPS,
    assert_equal_steps,
    curves,
    one_process_reference,
    reference_export,
)
from tests.once import built_once

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_process_reference(tmp_path_factory)


@pytest.fixture(scope="module")
def one_process(one_process_run: Path) -> list[dict[str, Any]]:
    return read_metrics(one_process_run)


def _exported(run: Path, out: Path) -> dict[str, torch.Tensor]:
    run_launch(["export", str(run), "--output", str(out)])
    return load_file(out / "model.safetensors")


def _assert_same_export(run_dir: Path, reference: dict[str, torch.Tensor], out: Path) -> None:
    """The export of a tp run: whole tensors, one process's names, shapes and weights."""
    ours = _exported(run_dir, out)
    assert sorted(ours) == sorted(reference)
    assert all(ours[k].shape == reference[k].shape for k in reference)
    assert max(float((ours[k] - reference[k]).abs().max()) for k in reference) < 1e-5


def _generates_as_one_process(run: Path, reference: Path, tmp_path: Path) -> None:
    """`launch generate` reads the tp run's DCP checkpoint (DTensors) into one process's model:
    greedy answers are the one-process run's. (`launch serve` loads it the same way:
    tests/e2e/test_openai_api.py serves a DCP checkpoint.)"""
    prompts = tmp_path / "prompts.jsonl"
    records = [{"prompt": "abc|", "max_new_tokens": 6}, {"prompt": "hello|", "max_new_tokens": 4}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    ours = run_launch(["generate", str(run), str(prompts)]).stdout
    assert ours == run_launch(["generate", str(reference), str(prompts)]).stdout
    assert json.loads(ours.splitlines()[0])["completion"], ours  # it answered something


@pytest.mark.parametrize(
    "extra",
    [
        # FSDP2 with sequence parallelism: test_launch_verify_certifies_dp2_tp2, the dp2 x tp2 x pp2
        # run and test_user_tp_plan.py's dp2 x tp2 run
        ["engine=ddp", "parallel.sequence_parallel=false"],  # replicas summed over dp
        ["engine=fsdp", "parallel.replicate=2"],  # HSDP: (dp_replicate, dp_shard, tp)
    ],
    ids=["ddp_no_sp", "hsdp"],
)
def test_dp2_tp2_accumulation_and_recompute_equal_one_process(
    tmp_path: Path, one_process: list[dict[str, Any]], extra: list[str]
) -> None:
    split = ["parallel.dp=2", "parallel.tp=2", "batch.grad_accum=2", "ac=full"]
    run_launch([*COMMON, *split, *extra], tmp_path)
    assert_equal_steps(tmp_path, one_process)
    summary = read_summary(tmp_path)
    assert (summary["world_size"], summary["dp"], summary["tp"]) == (4, 2, 2)


def test_tp2_compiled_equals_one_process(tmp_path: Path, one_process: list[dict[str, Any]]) -> None:
    """train.compile after the plan (torchtitan's order): the compiled blocks run on DTensors."""
    run_launch([*COMMON, "parallel.tp=2", "train.compile=true"], tmp_path)
    ours, theirs = curves(read_metrics(tmp_path)), curves(one_process)
    assert ours["tokens"] == theirs["tokens"]
    assert max_rel_diff(ours["loss"], theirs["loss"]) < 1e-5
    assert max_rel_diff(ours["grad_norm"], theirs["grad_norm"]) < 1e-5


def test_counting_tokens_per_world_rank_is_caught(
    tmp_path: Path, one_process: list[dict[str, Any]]
) -> None:
    """The negative control: both ranks of the tp pair add their (shared) tokens."""
    run_launch([*COMMON, "parallel.tp=2", "debug.broken_tp_count=true"], tmp_path)
    ours, theirs = curves(read_metrics(tmp_path)), curves(one_process)
    assert ours["tokens"] == [2 * t for t in theirs["tokens"]]
    assert max_rel_diff(ours["grad_norm"], theirs["grad_norm"]) > 0.1
    with pytest.raises(AssertionError):
        assert_equal_steps(tmp_path, one_process)


def test_a_tp2_checkpoint_resumes_on_dp2_without_tp(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    one_process: list[dict[str, Any]],
    one_process_run: Path,
) -> None:
    """tp=2 for HALF steps: one process's steps, and its checkpoint (DCP's async save of the
    DTensors) exports and generates as one process's checkpoint of that step. DCP reshards: the
    steps after it at dp=2 are one process's."""
    run_dir = tmp_path / "run"
    stop = [f"train.steps={HALF}", "checkpoint.async=true"]
    run_launch([*COMMON, "parallel.tp=2", *stop], run_dir)
    summary = read_summary(run_dir)
    assert (summary["world_size"], summary["dp"], summary["tp"]) == (2, 1, 2)
    reference = load_file(reference_export(tmp_path_factory, HALF) / "model.safetensors")
    _assert_same_export(run_dir, reference, tmp_path / "export")
    _generates_as_one_process(run_dir, one_process_run / "checkpoints" / f"step_{HALF}", tmp_path)
    proc = run_launch([*COMMON, "parallel.dp=2"], run_dir)
    assert "resuming from" in proc.stdout + proc.stderr
    # The first steps too: all lie in the 20-step warm-up, so the shorter run had the same rates.
    assert_equal_steps(run_dir, one_process)


def test_launch_verify_certifies_dp2_tp2(tmp_path: Path) -> None:
    split = ["parallel.dp=2", "parallel.tp=2", "verify.steps=2"]
    args = ["verify", *FAST, "batch.global_size=8", *split]
    proc = run_launch([*args, "engine=fsdp", "batch.grad_accum=2"], tmp_path)
    certificate = json.loads((tmp_path / "verify.json").read_text())
    assert certificate["certified"], proc.stdout
    assert certificate["split"]["tp"] == 2 and certificate["split"]["dp"] == 2
    assert "dp2 x tp2 x acc2 x micro2" in proc.stdout


LLAMA = [
    "train",
    f"train.steps={STEPS}",
    "batch.global_size=8",
    "wandb.mode=disabled",
    "data.eval_problems=16",
    "model=hf",
    "model.config=tests/fixtures/tiny_llama.json",
]


@pytest.fixture(scope="module")
def llama_one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, "tp-llama-one-process", lambda p: run_launch(LLAMA, p))


def test_hf_llama_dp2_tp2_equals_one_process_exports_its_weights_and_resumes_on_dp2(
    tmp_path: Path, llama_one_process: Path
) -> None:
    """A Hugging Face Llama (tiny, from a config) through its family's base_model_tp_plan; its
    export has one process's tensor names, shapes and weights (transformers' own names); its
    step-HALF checkpoint resumes on dp=2 without tp (and on ddp) and the steps after it are one
    process's."""
    split_dir, resumed = tmp_path / "split", tmp_path / "resumed"
    split = ["parallel.dp=2", "parallel.tp=2", "engine=fsdp", "batch.grad_accum=2"]
    run_launch([*LLAMA, *split, f"checkpoint.every={HALF}"], split_dir)
    reference = read_metrics(llama_one_process)
    assert_equal_steps(split_dir, reference)
    theirs = _exported(llama_one_process, tmp_path / "theirs")
    _assert_same_export(split_dir, theirs, tmp_path / "ours")
    half = split_dir / "checkpoints" / f"step_{HALF}"
    proc = run_launch([*LLAMA, "parallel.dp=2", f"train.resume={half}"], resumed)
    assert "resuming from" in proc.stdout + proc.stderr
    assert_equal_steps(resumed, reference, first=HALF)


def test_a_family_without_a_plan_is_refused_before_launch(tmp_path: Path) -> None:
    gpt2 = ["model=hf", "model.config=tests/fixtures/tiny_gpt2.json"]
    args = ["plan", *gpt2, "parallel.tp=2", "wandb.mode=disabled"]
    proc = run_launch(args, tmp_path, check=False)
    assert proc.returncode != 0
    assert "parallel.tp, model: the gpt2 family has no tensor-parallel plan" in proc.stderr
    assert "Fix: set parallel.tp=1" in proc.stderr
    assert not (tmp_path / "plan.json").exists()
