"""The test-only switches of `debug.*`, turned into the loop's hooks once, at build time.

They stay config keys (end-to-end tests pass them on the command line), but the training path
has no branch for them: a raise or a sleep is a step callback, the negative control is a loss
function.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launcher.config.root import RootConfig
from launcher.rundir import SAVE_PAUSED_FILE
from launcher.training.hooks import StepCallback
from launcher.training.loss import LossFn, per_micro_batch_mean, token_exact_loss
from launcher.userpath import replace_own


class RaiseAtStep:
    """Make one rank raise when step `at` (1-based) is about to run (failure handling)."""

    def __init__(self, at: int, rank: int) -> None:
        self.at, self.rank = at, rank

    def before_step(self, step: int) -> None:
        if step == self.at:
            raise RuntimeError(f"debug.raise_at_step={step}: rank {self.rank} raises on purpose")

    def after_step(self, step: int) -> None:
        del step


class SleepAfterStep:
    """Pause after every step, so that a test can signal or kill a run mid-way."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def before_step(self, step: int) -> None:
        del step

    def after_step(self, step: int) -> None:
        del step
        time.sleep(self.seconds)


def debug_callbacks(cfg: RootConfig, rank: int) -> list[StepCallback]:
    debug = cfg.debug
    callbacks: list[StepCallback] = []
    if debug.raise_at_step is not None and debug.raise_on_rank == rank:
        callbacks.append(RaiseAtStep(debug.raise_at_step, rank))
    if debug.step_sleep_s:
        callbacks.append(SleepAfterStep(debug.step_sleep_s))
    return callbacks


class PauseSave:
    """Hold the save of step `at` before its completion record, forever: its files are written
    (asynchronously or not), nothing marks them complete, and a test kills the run there. The
    pause is announced in the run directory, so the test waits for a file, not for time."""

    def __init__(self, at: int, run_dir: Path) -> None:
        self.at, self.run_dir = at, run_dir

    def __call__(self, step: int) -> None:
        if step != self.at:
            return
        replace_own(self.run_dir / SAVE_PAUSED_FILE, json.dumps({"step": step}) + "\n")
        threading.Event().wait()


def save_pause(cfg: RootConfig, run_dir: Path) -> Callable[[int], None] | None:
    at = cfg.debug.pause_save_at_step
    return PauseSave(at, run_dir) if at is not None else None


def stop_at_end(cfg: RootConfig, rank: int) -> None:
    """debug.stop_at_end_on_rank: this rank stops itself after the final checkpoint (SIGSTOP:
    it cannot answer, not even with its stack), as a rank wedged at the end of a run would."""
    if cfg.debug.stop_at_end_on_rank == rank:
        os.kill(os.getpid(), signal.SIGSTOP)


def loss_function(cfg: RootConfig) -> LossFn:
    """The token-exact loss, or the named negative control (debug.broken_normalization)."""
    return per_micro_batch_mean if cfg.debug.broken_normalization else token_exact_loss
