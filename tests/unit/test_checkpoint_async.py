"""checkpoint.async=true in one process: training goes on while a save is finished, the result
is the synchronous save's, and nothing is complete before its record (issue 24). The kill -9
during an asynchronous save is tests/e2e/test_checkpoint_async.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from launcher.checkpoint.checkpointer import Checkpointer
from launcher.checkpoint.files import MARKER, find_checkpoints
from launcher.config import to_root_config
from launcher.config.load import to_plain, to_yaml
from launcher.distributed import DistContext
from launcher.errors import ConfigError
from tests.harness import build_trainer
from tests.unit.test_checkpoint import config, ctx, run, train

__all__ = ["ctx"]  # the fixture, shared with test_checkpoint.py

ASYNC = {"async": True}


def test_the_key_is_checkpoint_async_everywhere() -> None:
    cfg = to_root_config({"checkpoint": ASYNC})
    assert cfg.checkpoint.async_ is True
    assert to_plain(cfg)["checkpoint"]["async"] is True
    assert "  async: true" in to_yaml(cfg)
    with pytest.raises(ConfigError) as refused:
        to_root_config({"checkpoint": ASYNC, "engine": {"name": "deepspeed", "zero_stage": 3}})
    assert refused.value.keys == ["checkpoint.async", "engine"]
    assert "Fix: set checkpoint.async=false" in str(refused.value)


def test_training_goes_on_while_a_save_is_finished_and_resumes_like_a_sync_run(
    ctx: DistContext, tmp_path: Path
) -> None:
    cfg = config(train={"steps": 6}, checkpoint={"every": 2, **ASYNC}, model={"dropout": 0.1})
    trainer = build_trainer(cfg, ctx, tmp_path / "async")
    checkpoints = Checkpointer(cfg, tmp_path / "async", ctx, trainer)
    root = tmp_path / "async" / "checkpoints"
    held, release = threading.Event(), threading.Event()

    def hold_step_2(step: int) -> None:
        if step == 2:
            held.set()
            release.wait(timeout=120)

    checkpoints.before_marker = hold_step_2
    losses = train(trainer, checkpoints, 2)  # the save of step 2 starts, and is held
    assert held.wait(timeout=120)
    losses += train(trainer, checkpoints, 1)  # step 3 trains while it is in flight
    assert not (root / "step_2").exists()
    assert not (root / ".tmp_step_2" / MARKER).exists()  # its files, but no record yet
    release.set()
    losses += train(trainer, checkpoints, 3)  # step 4's save waits for step 2's first
    checkpoints.save_final()
    assert [c.step for c in find_checkpoints(tmp_path / "async")] == [6, 4]  # keep=2, verified

    sync_cfg = config(train={"steps": 6}, checkpoint={"every": 2}, model={"dropout": 0.1})
    assert losses == run(sync_cfg, ctx, tmp_path / "sync")  # the same training, bitwise

    resumed_cfg = config(
        train={"steps": 6, "resume": str(root / "step_4")},
        checkpoint={"every": 2, **ASYNC},
        model={"dropout": 0.1},
    )
    again = build_trainer(resumed_cfg, ctx, tmp_path / "async")
    resumed = Checkpointer(resumed_cfg, tmp_path / "async", ctx, again).resume()
    assert resumed is not None and resumed.step == 4
    again.continue_from(resumed.step, resumed.totals)
    assert train(again, Checkpointer(resumed_cfg, tmp_path / "async", ctx, again), 2) == losses[4:]
