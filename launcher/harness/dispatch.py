"""Evaluation during training (eval.harness.every): training's rank 0 starts each chosen
checkpoint's evaluation once the checkpoint is complete, and never waits for it while training
goes on; the training ranks are not held.

- cluster=local: `launch eval CHECKPOINT` as a background process (its output in
  eval/step_N.log); at the end of training, before the summary, rank 0 waits for those still
  running, at most eval.harness.wait_s (they go on after that and write their results
  themselves);
- cluster=slurm: the same command as a job of its own (launcher/harness/slurm_job.py).

The evaluation writes its scores (or its failure) itself: eval/step_N.json, a metrics.jsonl line
at step N, the trackers (launcher/harness/record.py). A failed evaluation is a warning here and a
record there, never a failed training. Until the evaluation has read its checkpoint, the marker
eval/step_N.pending keeps checkpoint.keep's pruning off that checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from launcher.config.root import RootConfig
from launcher.harness.command import RECORD_FAILURE
from launcher.logs import get_logger
from launcher.rundir import PENDING_SUFFIX as PENDING
from launcher.rundir import harness_file

log = get_logger("eval")

TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE",
)
"""A rank's own environment, which the evaluation (one process, no process group) must not see."""


@dataclass
class Running:
    step: int
    process: subprocess.Popen[bytes]
    log_file: IO[bytes]


def evaluates(cfg: RootConfig, step: int) -> bool:
    """Whether the checkpoint of `step` is evaluated: a multiple of eval.harness.every, or the
    last step."""
    every = cfg.eval.harness.every
    return bool(every) and (step % every == 0 or step == cfg.train.steps)


def eval_argv(cfg: RootConfig, checkpoint: Path) -> list[str]:
    """`launch eval`'s arguments: the checkpoint, a failure recorded, include_path absolute (the
    job may start elsewhere)."""
    argv = [str(checkpoint.resolve()), RECORD_FAILURE]
    include = cfg.eval.harness.include_path
    if include is not None:
        argv.append(f"eval.harness.include_path={Path(include).expanduser().resolve()}")
    return argv


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Evaluations:
    """Rank 0's evaluations of this training run's checkpoints."""

    def __init__(self, cfg: RootConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.running: list[Running] = []
        self.started = 0
        self.failed = 0

    def checkpoint_done(self, step: int, checkpoint: Path) -> None:
        """Called once the checkpoint of `step` is complete and in place."""
        self.poll()
        if not evaluates(self.cfg, step):
            return
        marker = harness_file(self.run_dir, step, PENDING)
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            if self.cfg.cluster.schedules_jobs:
                self._submit(step, checkpoint)
            else:
                self._start(step, checkpoint)
            self.started += 1
        except Exception as exc:  # never fails training
            marker.unlink(missing_ok=True)
            self.failed += 1
            log.warning(
                f"the evaluation of step {step} did not start ({type(exc).__name__}: {exc}); "
                f"training goes on. Run it later: launch eval {checkpoint}"
            )

    def _start(self, step: int, checkpoint: Path) -> None:
        out = open(harness_file(self.run_dir, step, ".log"), "ab")  # noqa: SIM115
        command = [sys.executable, "-m", "launcher.cli", "eval", *eval_argv(self.cfg, checkpoint)]
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_environment(),
            start_new_session=True,  # a Ctrl-C meant for training does not reach it
        )
        self.running.append(Running(step, process, out))
        log.info(
            f"evaluating step {step} in the background (pid {process.pid}; output in "
            f"{harness_file(self.run_dir, step, '.log')})"
        )

    def _submit(self, step: int, checkpoint: Path) -> None:
        from launcher.harness.slurm_job import submit_eval_job

        job = submit_eval_job(
            self.cfg, self.run_dir, step, eval_argv(self.cfg, checkpoint), _environment()
        )
        log.info(f"submitted SLURM job {job}: the evaluation of step {step}")

    def poll(self) -> None:
        """Report the evaluations that ended."""
        still = []
        for item in self.running:
            if item.process.poll() is None:
                still.append(item)
            else:
                self._ended(item)
        self.running = still

    def _ended(self, item: Running) -> None:
        item.log_file.close()
        harness_file(self.run_dir, item.step, PENDING).unlink(missing_ok=True)
        code = item.process.returncode
        if code == 0:
            log.info(
                f"evaluation of step {item.step} done: {harness_file(self.run_dir, item.step)}"
            )
            return
        self.failed += 1
        log.warning(
            f"evaluation of step {item.step} failed (exit status {code}); training is not "
            f"affected. See {harness_file(self.run_dir, item.step, '.log')}"
        )

    def finish(self) -> None:
        """The end of training: wait for the local evaluations, at most eval.harness.wait_s."""
        self.poll()
        if not self.running:
            return
        bound = self.cfg.eval.harness.wait_s
        log.info(f"waiting for {len(self.running)} evaluation(s), at most {bound} s")
        deadline = time.monotonic() + bound
        for item in self.running:
            try:
                item.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                continue
        self.poll()
        for item in self.running:
            log.warning(
                f"evaluation of step {item.step} still running after eval.harness.wait_s="
                f"{bound} (pid {item.process.pid}); it writes "
                f"{harness_file(self.run_dir, item.step)} when done."
            )
