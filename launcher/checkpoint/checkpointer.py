"""Training-state checkpoints of a running job: saved atomically by all ranks together,
resumed exactly (the loading is launcher/checkpoint/resume.py).

Every rank takes part in each save (launcher/checkpoint/files.py has the layout and the rules for
which checkpoint to use). A save is complete only once its completion record lists every rank's
closed files, and only then renamed into place: a crash at any point leaves the previous
checkpoint intact. With checkpoint.async=true the state is copied on the training thread and the
rest finished by launcher/checkpoint/background.py. Nothing here unpickles code: RNG files are
read with torch.load(weights_only=True), DCP through launcher/engines/dcp.py, the rest is JSON.
DCP itself is imported by the engine that writes or reads it, never here: a run that saves
nothing does not pay for it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

from launcher.checkpoint.background import (
    FAILURE_WAIT_S,
    BackgroundSave,
    checkpoint_group,
    finish_after_failure,
)
from launcher.checkpoint.collective import agree, attempt, barrier
from launcher.checkpoint.compat import fingerprint
from launcher.checkpoint.files import (
    ENGINE_DIR,
    MARKER,
    META,
    RNG_DIR,
    STEP_PREFIX,
    TMP_PREFIX,
    checkpoints_dir,
    commit,
    manifest,
    prune,
    write_synced,
)
from launcher.checkpoint.resume import ResumeState, load_resume_state
from launcher.checkpoint.rng import rng_state
from launcher.config.root import RootConfig
from launcher.exit_codes import STOPPED_RESUMABLE
from launcher.integrity.data import data_identity
from launcher.logs import get_logger
from launcher.models.adapted import BASE_KEY
from launcher.rundir import write_stopped

if TYPE_CHECKING:
    from launcher.distributed import DistContext
    from launcher.training.loop import Trainer
    from launcher.worker.stop import StopFlag

log = get_logger("checkpoint")

_T = TypeVar("_T")


def _written(future: Future[Any]) -> None:
    """Wait for a background write; its error, if any, is raised."""
    future.result()


class Checkpointer:
    """Saves one Trainer's whole state and loads it back; every method is collective over the
    ranks. A step callback of the Trainer (after_step saves every checkpoint.every steps)."""

    def __init__(self, cfg: RootConfig, run_dir: Path, ctx: DistContext, trainer: Trainer) -> None:
        self.cfg, self.run_dir, self.ctx, self.trainer = cfg, run_dir, ctx, trainer
        self.root = checkpoints_dir(run_dir)
        self.last_saved: tuple[int, Path] | None = None
        self.pending: BackgroundSave | None = None
        """The asynchronous save in flight (checkpoint.async=true)."""
        self.before_marker: Callable[[int], None] | None = None
        """Called on rank 0 with the step before a completion record is written (a test's
        pause: launcher/worker/debug.py)."""
        self.after_commit: Callable[[int, Path], None] | None = None
        """Called on rank 0 with the step and the path once a checkpoint is complete and in
        place (evaluation during training: launcher/harness/dispatch.py)."""
        self.rank_written: Callable[[], None] = lambda: None  # files written (held_save.py)
        self.base: dict[str, Any] | None = None
        """An adapter run's base weights (launcher/models/adapted.py): recorded in meta.json,
        checked on resume."""
        self.group = checkpoint_group() if self.enabled and cfg.checkpoint.async_ else None

    @property
    def enabled(self) -> bool:
        return self.cfg.checkpoint.enabled

    # saving

    def before_step(self, step: int) -> None:
        del step

    def saves_after(self, step: int) -> bool:
        """Whether after_step saves a checkpoint after this step (a periodic save)."""
        every = self.cfg.checkpoint.every
        return self.enabled and bool(every) and step % every == 0 and step < self.cfg.train.steps

    def after_step(self, step: int) -> None:
        if self.saves_after(step):
            self.save()

    def save_final(self) -> Path | None:
        """At the end of training, or at a graceful stop; nothing new when this step is saved.
        Returns once every save, an asynchronous one too, is complete."""
        if not self.enabled:
            return None
        if self.trainer.step == 0 and self.last_saved is None:
            # Nothing trained: the seed rebuilds this state, and an optimizer that never stepped
            # has no state a later resume could load (a stop at step 0: an elastic re-rendezvous).
            return None
        self.trainer.flush()
        self.wait()
        if self.last_saved is None or self.last_saved[0] != self.trainer.step:
            self.save()
            self.wait()
        assert self.last_saved is not None
        return self.last_saved[1]

    def stop(self, reason: str | None) -> Path | None:
        """A graceful stop: save this step, leave stopped.json, and only then let the ranks exit
        (torchrun may restart the others as soon as one exits; they must find the marker)."""
        saved = self.save_final()
        if self.ctx.is_main:
            write_stopped(self.run_dir, self.trainer.step, saved, reason)
            where = f"saved {saved}" if saved else f"nothing saved ({self._unsaved_reason()})"
            # Nothing trained and nothing saved before: the same command starts over.
            fresh = saved is None and self.enabled and self.trainer.step == 0
            log.warning(
                f"stopped after step {self.trainer.step} of {self.cfg.train.steps}, {where}. "
                f"Run the same command to {'start over' if fresh else 'resume'} (exit status "
                f"{STOPPED_RESUMABLE})."
            )
        barrier()
        return saved

    def _unsaved_reason(self) -> str:
        if not self.enabled:
            return "checkpoint.enabled=false"
        return "no step was trained yet"

    def save(self) -> Path:
        """Collective: save this step. With checkpoint.async=true the state is copied and the
        save finished in the background (wait() or the next save collects it)."""
        self.wait()  # at most one save in flight
        # The step in flight is logged first: metrics.jsonl and the saved totals include it.
        self.trainer.flush()
        step, ctx = self.trainer.step, self.ctx
        tmp, final = self.root / f"{TMP_PREFIX}{step}", self.root / f"{STEP_PREFIX}{step}"
        started = time.perf_counter()
        if ctx.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # a save of this step that was interrupted
        meta = self._meta(step)
        if self.group is not None:
            self.pending = self._save_in_background(step, tmp, final, meta, started, self.group)
            return final
        engine = self.trainer.engine
        # Every rank's files are closed before the marker lists them; a failed write on any rank
        # (a full disk) fails the save on every rank, and the last complete checkpoint stays.
        self._agree(
            attempt(lambda: self._write_rank_files(tmp, lambda d: engine.save_checkpoint(d, meta))),
            tmp,
        )
        self._complete(tmp, final, meta, started, None)
        self.last_saved = (step, final)
        return final

    def _save_in_background(
        self,
        step: int,
        tmp: Path,
        final: Path,
        meta: dict[str, Any],
        started: float,
        group: dist.ProcessGroup,
    ) -> BackgroundSave:
        """Collective: every rank's state copied now; then written, agreed on over `group`,
        recorded and renamed into place by a background thread while training goes on."""
        engine = self.trainer.engine
        writing: list[Future[Any]] = []

        def start() -> None:
            write = lambda d: engine.save_checkpoint_async(d, group)  # noqa: E731
            writing.append(self._write_rank_files(tmp, write))

        self._agree(attempt(start), tmp)

        def finish() -> None:
            self._agree(attempt(lambda: _written(writing[0])), tmp, group)
            self._complete(tmp, final, meta, started, group)

        return BackgroundSave(step, final, finish)

    def wait(self) -> None:
        """Collective: finish the asynchronous save in flight, if any; its error is raised here."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.wait()
            self.last_saved = (pending.step, pending.final)

    def finish_after_failure(
        self, failure: BaseException, stop: StopFlag | None = None, timeout: float = FAILURE_WAIT_S
    ) -> None:
        """Training failed on this rank: let the asynchronous save in flight, if any, finish
        (launcher/checkpoint/background.py's finish_after_failure)."""
        pending, self.pending = self.pending, None
        if pending is not None and finish_after_failure(pending, failure, stop, timeout):
            self.last_saved = (pending.step, pending.final)

    def _complete(
        self,
        tmp: Path,
        final: Path,
        meta: dict[str, Any],
        started: float,
        group: dist.ProcessGroup | None,
    ) -> None:
        """Collective over `group`, once every rank's files are written: the completion record,
        then the rename into place and the pruning of older checkpoints."""
        error = None
        if self.ctx.is_main:
            if self.before_marker is not None:
                self.before_marker(meta["step"])
            error = attempt(lambda: self._write_marker(tmp, meta, meta["step"]))
        self._agree(error, tmp, group)
        if self.ctx.is_main:
            commit(tmp, final)
            prune(self.run_dir, self.cfg.checkpoint.keep, final)
            log.info(f"saved checkpoint {final} ({time.perf_counter() - started:.1f}s)")
            if self.after_commit is not None:
                self.after_commit(meta["step"], final)
        barrier(group)  # nobody moves on (or exits) before the checkpoint is in place

    def _write_rank_files(self, tmp: Path, write_engine: Callable[[Path], _T]) -> _T:
        ctx = self.ctx
        if ctx.is_main:
            tmp.mkdir()
        barrier()
        written = write_engine(tmp / ENGINE_DIR)
        (tmp / RNG_DIR).mkdir(parents=True, exist_ok=True)
        with open(tmp / RNG_DIR / f"rank_{ctx.rank}.pt", "wb") as f:
            torch.save(rng_state(ctx.device), f)
            f.flush()
            os.fsync(f.fileno())
        self.rank_written()
        return written

    def _write_marker(self, tmp: Path, meta: dict[str, Any], step: int) -> None:
        meta = {**meta, "data": data_identity(self.cfg.data)}  # digests cached: cheap
        write_synced(tmp / META, json.dumps(meta, indent=2) + "\n")
        record = {"step": step, **manifest(tmp)}
        write_synced(tmp / MARKER, json.dumps(record, indent=2) + "\n")

    def _agree(
        self, error: BaseException | None, tmp: Path, group: dist.ProcessGroup | None = None
    ) -> None:
        """Collective over `group`: every rank's write succeeded, or every rank raises
        (launcher/checkpoint/collective.py)."""
        agree(error, tmp, self.run_dir, self.ctx.device, self.ctx.is_main, group)

    def _meta(self, step: int) -> dict[str, Any]:
        split = self.cfg.split()
        return {
            "step": step,
            "samples_seen": step * split.global_size,
            "saved_at": time.time(),
            "engine": self.cfg.engine.name.value,
            "world_size": self.ctx.world_size,
            "split": dataclasses.asdict(split),
            "fingerprint": fingerprint(self.cfg),
            "totals": dataclasses.asdict(self.trainer.tracker.totals),
            **({BASE_KEY: self.base} if self.base is not None else {}),
        }

    # resuming

    def resume(self, restarted: bool = False) -> ResumeState | None:
        """Collective: load the checkpoint train.resume asks for into the engine and the RNGs
        (launcher/checkpoint/resume.py); the step and totals to continue from (None: start)."""
        resumed = load_resume_state(
            self.cfg, self.run_dir, self.ctx, self.trainer.engine, restarted, self.base
        )
        if resumed is not None:
            self.last_saved = (resumed.step, resumed.checkpoint.path)
        return resumed
