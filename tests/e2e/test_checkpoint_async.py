"""checkpoint.async=true through `launch`: a kill -9 while an asynchronous save is being finished
loses nothing (issue 24). The save of step 4 is held before its completion record
(debug.pause_save_at_step, announced in save_paused.json); training goes on to the last step
meanwhile; then the whole job is killed. The previous checkpoint is intact, the held one is never
complete, and the same command resumes to the losses the killed run logged."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from launcher.checkpoint.files import MARKER, find_checkpoints
from launcher.rundir import SAVE_PAUSED_FILE
from tests.e2e.test_resume import ENV, last_per_step
from tests.helpers import FAST, BackgroundLaunch, read_losses, run_launch

pytestmark = [pytest.mark.e2e]

ARGS = [
    "train",
    "train.steps=6",
    "batch.global_size=8",
    "batch.micro_size=4",
    *FAST,
    "checkpoint.async=true",
    "checkpoint.every=2",
]


def wait_for(what: str, ready: object, launch: BackgroundLaunch, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        assert launch.proc.poll() is None, f"launch ended early:\n{launch.output}"
        assert time.monotonic() < deadline, f"no {what} in {timeout}s:\n{launch.output}"
        time.sleep(0.05)


def test_kill_during_an_async_save_keeps_the_previous_and_resumes_exactly(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", **ENV}
    launch = BackgroundLaunch(
        [*ARGS, "debug.pause_save_at_step=4"], run_dir, tmp_path / "run.log", env, own_session=True
    )
    try:
        wait_for("paused save", (run_dir / SAVE_PAUSED_FILE).is_file, launch)
        # Training is not held by the save: it reaches the last step while step 4's is in flight.
        wait_for("step 6", lambda: launch.steps_logged() >= 6, launch)
    finally:
        os.killpg(launch.proc.pid, signal.SIGKILL)
        launch.wait()
    root = run_dir / "checkpoints"
    assert json.loads((run_dir / SAVE_PAUSED_FILE).read_text()) == {"step": 4}
    assert (root / ".tmp_step_4" / "engine" / ".metadata").is_file()  # written ...
    assert not (root / ".tmp_step_4" / MARKER).exists() and not (root / "step_4").exists()
    assert [c.step for c in find_checkpoints(run_dir, warn=False)] == [2]  # digests verified
    logged = read_losses(run_dir)  # steps 1-6 of the killed run, trained undisturbed
    assert len(logged) == 6

    proc = run_launch(ARGS, run_dir, env=ENV)
    assert f"resuming from {root / 'step_2'} after step 2" in proc.stdout
    assert last_per_step(run_dir) == logged  # bitwise: nothing was lost
    assert [c.step for c in find_checkpoints(run_dir, warn=False)] == [6, 4]
    assert not (root / ".tmp_step_4").exists()
