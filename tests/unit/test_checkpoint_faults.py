"""Bad days in one process (issue 17): every checkpoint damaged, a loss that becomes NaN, a full
disk's error as DCP reports it. The end-to-end versions are in tests/e2e/test_bad_day.py."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from traceback import StackSummary

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from launcher.checkpoint.checkpointer import Checkpointer
from launcher.checkpoint.files import MARKER, find_checkpoints
from launcher.checkpoint.preflight import check_resume
from launcher.checkpoint.space import is_disk_full, written_path
from launcher.distributed import DistContext
from launcher.errors import ConfigError
from launcher.exit_codes import DIVERGED
from launcher.training.step import LossNotFinite
from tests.harness import build_trainer
from tests.unit.test_checkpoint import config, ctx, run

__all__ = ["ctx"]  # the fixture, shared with test_checkpoint.py


def snapshot(root: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_every_checkpoint_damaged_is_refused_not_restarted(
    ctx: DistContext, tmp_path: Path
) -> None:
    cfg = config()
    run(cfg, ctx, tmp_path)  # step_2 and step_4
    root = tmp_path / "checkpoints"
    for step in (2, 4):
        shard = max((root / f"step_{step}" / "engine").glob("*.distcp"), key=os.path.getsize)
        os.truncate(shard, shard.stat().st_size // 2)
    before = snapshot(root)
    with pytest.raises(ConfigError) as refused:  # in `launch`, before any rank starts
        check_resume(cfg, tmp_path)
    text = str(refused.value)
    assert text.startswith("train.resume:")
    assert "step_2 (" in text and "step_4 (" in text and "truncated" in text
    assert "train.resume=never checkpoint.overwrite=true" in text
    # A rank restarted by torchrun, seeing the same files, refuses too instead of starting over.
    trainer = build_trainer(cfg, ctx, tmp_path)
    with pytest.raises(ConfigError):
        Checkpointer(cfg, tmp_path, ctx, trainer).resume(restarted=True)
    assert snapshot(root) == before


def test_checkpoints_that_pass_inspection_but_none_loads_are_refused_by_the_ranks(
    ctx: DistContext, tmp_path: Path
) -> None:
    cfg = config()
    run(cfg, ctx, tmp_path)
    root = tmp_path / "checkpoints"
    for step in (2, 4):  # same size: only the digests, or loading, can tell
        metadata = root / f"step_{step}" / "engine" / ".metadata"
        metadata.write_bytes(b"\0" * metadata.stat().st_size)
    # step_2 as written before digests were recorded: its sizes alone are checked.
    marker = json.loads((root / "step_2" / MARKER).read_text())
    (root / "step_2" / MARKER).write_text(json.dumps({"step": 2, "files": marker["files"]}))
    check_resume(cfg, tmp_path)  # sizes match their markers: `launch` does not read them whole
    trainer = build_trainer(cfg, ctx, tmp_path)
    with pytest.raises(ConfigError) as refused:
        Checkpointer(cfg, tmp_path, ctx, trainer).resume()
    text = str(refused.value)
    assert "step_4 (engine/.metadata does not match the digest written at save" in text
    assert "step_2 (it could not be loaded" in text
    assert "train.resume=never checkpoint.overwrite=true" in text


def test_a_nan_loss_stops_the_run_and_no_checkpoint_of_it_is_saved(
    ctx: DistContext, tmp_path: Path
) -> None:
    cfg = config(train={"steps": 6}, optim={"lr": 1e30, "warmup_steps": 0}, checkpoint={"every": 1})
    trainer = build_trainer(cfg, ctx, tmp_path)
    checkpoints = Checkpointer(cfg, tmp_path, ctx, trainer)
    trainer.callbacks = [checkpoints]
    with pytest.raises(LossNotFinite) as stopped:
        trainer.train()
    bad = stopped.value.step
    assert stopped.value.exit_code == DIVERGED
    saved = [c.step for c in find_checkpoints(tmp_path)]
    assert saved and max(saved) == bad - 1  # every step before the NaN, none from it on
    text = str(stopped.value)
    assert f"step {bad}: the loss is" in text and "Fix: lower optim.lr" in text
    assert f"the last good checkpoint is step {bad - 1} ({tmp_path / 'checkpoints'}" in text


def test_a_full_disk_is_recognised_inside_dcp_errors(tmp_path: Path) -> None:
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.distcp"))
    wrapped = CheckpointException(
        "save", {0: (full, StackSummary())}
    )  # DCP gathers the ranks' errors
    assert is_disk_full(wrapped, tmp_path)
    assert written_path(wrapped, tmp_path) == str(tmp_path / "x.distcp")
    other = CheckpointException("save", {0: (ValueError("bad"), StackSummary())})
    assert not is_disk_full(other, tmp_path)  # a disk with room: not a full-disk error


def test_a_damaged_file_is_not_answered_with_torchs_unsafe_advice() -> None:
    """Found by the new-user probe: the reason for a checkpoint with zeros written into it was
    torch's "Re-running torch.load with weights_only set to False will likely succeed"."""
    import pickle

    from launcher.checkpoint.resume import load_cause

    exc = pickle.UnpicklingError(
        "Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` "
        "will likely succeed, but it can result in arbitrary code execution."
    )
    words = load_cause(exc)
    assert "weights_only" not in words and "damaged" in words
    long_path = "/tmp/" + "x" * 300
    assert long_path in load_cause(FileNotFoundError(f"No such file or directory: '{long_path}'"))
