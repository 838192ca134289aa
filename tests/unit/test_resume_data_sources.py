"""Exact resume on the user's own data (issue 13): a token file (data=tokens) and a dataset
tokenized with a tokenizer trained here (data=hf). In one process: train N steps straight, or N/2
steps, stop (the graceful stop saves a checkpoint), then resume to N in the same run directory.
The resumed run logs the same per-step losses bitwise, and its metrics.jsonl has every step once.

Global batch 8 as 2 micro-batches of 4 (accumulation on); the tokenized dataset is a few windows
long, so the 6 steps cross several epochs and the stop falls mid-epoch.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from launcher.checkpoint.checkpointer import Checkpointer
from launcher.checkpoint.files import find_checkpoints
from launcher.config import to_root_config
from launcher.config.root import RootConfig
from launcher.distributed import DistContext, init_distributed, teardown_distributed
from launcher.rundir import METRICS_FILE
from launcher.tracking.tracker import Tracker
from launcher.training.loop import Trainer
from tests.data_sources import train_tokenizer, write_texts, write_tokens
from tests.harness import build_trainer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STEPS, SEQ = 6, 24
# The user's own model by `_target_`, dropout on: the restored RNG state matters too.
USER_MODEL = {"_target_": "tests.fixtures.models.TinyLM", "d_model": 32, "n_layer": 2}
HF_MODEL = {
    "_target_": "launcher.models.hf.build_hf",
    "name": "hf",
    "config": str(FIXTURES / "tiny_llama.json"),
}


@pytest.fixture
def ctx() -> Iterator[DistContext]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops on a shared machine
    context = init_distributed("cpu")  # a one-rank gloo group in this process
    try:
        yield context
    finally:
        teardown_distributed()
        torch.set_num_threads(threads)


def config(model: dict[str, Any], data: dict[str, Any]) -> RootConfig:
    return to_root_config(
        {
            "model": {**model, "seq_len": SEQ},
            "data": data,
            "train": {"steps": STEPS, "precision": "fp32"},
            "optim": {"warmup_steps": 0},
            "batch": {"global_size": 8, "micro_size": 4},
            "wandb": {"mode": "disabled"},
        }
    )


class StopAfter:
    """A stop request (as a signal would make one) once `step` steps are done."""

    def __init__(self, trainer: Trainer, step: int) -> None:
        self.trainer, self.step = trainer, step

    @property
    def requested(self) -> bool:
        return self.trainer.step >= self.step


def launch(cfg: RootConfig, ctx: DistContext, run_dir: Path, stop_after: int | None = None) -> int:
    """What a rank does (worker/run.py): resume if there is a checkpoint, train, save; the step
    reached. stop_after: stop gracefully there (a checkpoint and stopped.json)."""
    trainer = build_trainer(cfg, ctx, run_dir)
    trainer.tracker = Tracker(run_dir, STEPS, 1, enabled=True, stream=io.StringIO())
    checkpoints = Checkpointer(cfg, run_dir, ctx, trainer)
    trainer.callbacks = [checkpoints]
    try:
        resumed = checkpoints.resume()
        if resumed is not None:
            trainer.continue_from(resumed.step, resumed.totals)
        stop = StopAfter(trainer, stop_after) if stop_after is not None else None
        if trainer.train(stop):
            checkpoints.save_final()
        else:
            checkpoints.stop("test")
    finally:
        trainer.tracker.close(0)
    return trainer.step


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / METRICS_FILE).read_text().splitlines()
    return [json.loads(line) for line in lines]


def assert_exact_resume(cfg: RootConfig, ctx: DistContext, tmp_path: Path) -> None:
    straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"
    straight_dir.mkdir()
    resumed_dir.mkdir()
    assert launch(cfg, ctx, straight_dir) == STEPS
    straight = metrics(straight_dir)
    assert [m["step"] for m in straight] == list(range(1, STEPS + 1))

    assert launch(cfg, ctx, resumed_dir, stop_after=STEPS // 2) == STEPS // 2
    assert [c.step for c in find_checkpoints(resumed_dir)] == [STEPS // 2]
    assert launch(cfg, ctx, resumed_dir) == STEPS
    resumed = metrics(resumed_dir)
    assert [m["step"] for m in resumed] == list(range(1, STEPS + 1))  # each step once
    for key in ("loss", "tokens", "grad_norm", "lr"):
        assert [m[key] for m in resumed] == [m[key] for m in straight], key  # bitwise


def test_token_file_resumes_exactly(ctx: DistContext, tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "train.bin", 40 * (SEQ + 1) + 1)  # 40 windows
    model = {**USER_MODEL, "dropout": 0.1}
    assert_exact_resume(config(model, {"name": "tokens", "path": str(path)}), ctx, tmp_path)


def test_tokenized_hf_dataset_resumes_exactly(ctx: DistContext, tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    data = {
        "name": "hf",
        "path": str(write_texts(tmp_path / "texts.jsonl", 60)),
        "tokenizer": str(train_tokenizer(tmp_path / "tok")),
        "cache_dir": str(tmp_path / "cache"),
    }
    cfg = config(HF_MODEL, data)
    assert_exact_resume(cfg, ctx, tmp_path)
    assert any((tmp_path / "cache").iterdir())  # tokenized once, then read from the cache
