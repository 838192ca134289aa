"""checkpoint.async=true in one process: training goes on while a save is finished, the result
is the synchronous save's, and nothing is complete before its record (issue 24). The kill -9
during an asynchronous save is tests/e2e/test_checkpoint_async.py."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from launcher.checkpoint.checkpointer import Checkpointer
from launcher.checkpoint.files import MARKER, find_checkpoints
from launcher.config import to_root_config
from launcher.config.load import to_plain, to_yaml
from launcher.distributed import DistContext
from launcher.errors import ConfigError
from launcher.worker.stop import StopFlag
from tests.harness import build_trainer
from tests.unit.test_checkpoint import config, ctx, run, train, warnings_seen

__all__ = ["ctx", "warnings_seen"]  # the fixtures, shared with test_checkpoint.py

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
    held, release = _held_at_step_2(checkpoints)
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


def _held_at_step_2(checkpoints: Checkpointer) -> tuple[threading.Event, threading.Event]:
    """Hold the save of step 2 before its completion record until `release` is set."""
    held, release = threading.Event(), threading.Event()

    def hold(step: int) -> None:
        if step == 2:
            held.set()
            release.wait(timeout=120)

    checkpoints.before_marker = hold
    return held, release


def test_a_failure_lets_the_save_in_flight_finish_first(
    ctx: DistContext, tmp_path: Path, warnings_seen: list[str]
) -> None:
    cfg = config(train={"steps": 6}, checkpoint={"every": 2, **ASYNC})
    trainer = build_trainer(cfg, ctx, tmp_path)
    checkpoints = Checkpointer(cfg, tmp_path, ctx, trainer)
    held, release = _held_at_step_2(checkpoints)
    train(trainer, checkpoints, 2)
    assert held.wait(timeout=120)
    # Training fails now (worker/run.py calls this on its error path); the save is let go later.
    threading.Timer(0.5, release.set).start()
    checkpoints.finish_after_failure(RuntimeError("rank 0 raises"), timeout=120)
    assert [c.step for c in find_checkpoints(tmp_path)] == [2]  # complete and verified
    assert checkpoints.last_saved == (2, tmp_path / "checkpoints" / "step_2")
    assert any(
        "training failed (RuntimeError: rank 0 raises); finishing the checkpoint of step 2" in w
        for w in warnings_seen
    )
    checkpoints.finish_after_failure(RuntimeError(), timeout=120)  # nothing in flight


def test_a_failure_gives_up_on_a_save_that_does_not_finish(
    ctx: DistContext, tmp_path: Path, warnings_seen: list[str]
) -> None:
    cfg = config(train={"steps": 6}, checkpoint={"every": 2, **ASYNC})
    earlier = StopFlag()
    earlier._handle(signal.SIGUSR1, None)  # SLURM's early warning came before the failure
    cases = (("not finished in 1s", None), ("abandoned", StopFlag()), ("abandoned", earlier))
    for n, (why, stop) in enumerate(cases):
        run_dir = tmp_path / str(n)
        trainer = build_trainer(cfg, ctx, run_dir)
        checkpoints = Checkpointer(cfg, run_dir, ctx, trainer)
        held, release = _held_at_step_2(checkpoints)
        train(trainer, checkpoints, 2)
        assert held.wait(timeout=120)
        if stop is not None:  # a stop signal while it waits (SLURM's SIGUSR1, a Ctrl-C)
            threading.Timer(0.3, stop._handle, args=(signal.SIGUSR1, None)).start()
        try:
            failure = RuntimeError("a peer died")
            checkpoints.finish_after_failure(failure, stop, timeout=1 if stop is None else 120)
            assert find_checkpoints(run_dir, warn=False) == []
            assert any(f"step 2 was {why}" in w for w in warnings_seen), warnings_seen
        finally:
            release.set()  # the held thread writes its record into a directory nobody reads
