"""Training-state checkpoints of a running job: saved atomically by all ranks together,
resumed exactly.

Every rank takes part in each save and load (launcher/checkpoint/files.py has the layout and
the rules for which checkpoint to use). Which samples a step reads depends on the step number
only (data/sampler.py), so the step is the sampler's whole position, and a resumed run may use
another dp, micro size or accumulation: DCP reshards the model and optimizer on load. Nothing
here unpickles code: DCP goes through launcher/checkpoint/dcp.py's restricted loaders, RNG files through
torch.load(weights_only=True), the rest is JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from launcher.checkpoint.compat import check_compatible, fingerprint
from launcher.checkpoint.files import (
    ENGINE_DIR,
    MARKER,
    META,
    RNG_DIR,
    STEP_PREFIX,
    TMP_PREFIX,
    Checkpoint,
    checkpoints_dir,
    commit,
    manifest,
    prune,
    resume_candidates,
    write_synced,
)
from launcher.config.root import RootConfig
from launcher.errors import LauncherError
from launcher.exit_codes import STOPPED_RESUMABLE
from launcher.logs import get_logger
from launcher.rundir import write_stopped
from launcher.tracking.metrics import RunTotals

if TYPE_CHECKING:
    from launcher.distributed import DistContext
    from launcher.training.loop import Trainer

log = get_logger("checkpoint")


# --- RNG states ----------------------------------------------------------------------------------


def rng_state(device: torch.device) -> dict[str, Any]:
    """This rank's RNG states in types torch.load(weights_only=True) accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (
            kind,
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ),
        "python": random.getstate(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def reseed(seed: int, rank: int, step: int) -> None:
    """A deterministic stream per (rank, step) when the saved per-rank states do not map."""
    base = seed + 1_000_003 * (rank + 1) + 7919 * step
    torch.manual_seed(base)
    np.random.seed(base % 2**32)
    random.seed(base)


# --- the worker side -----------------------------------------------------------------------------


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _all_ranks(ok: bool, device: torch.device) -> bool:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


@dataclasses.dataclass(frozen=True)
class ResumeState:
    """Where a resumed run continues: after `step`, with the run's totals so far."""

    checkpoint: Checkpoint
    step: int
    totals: RunTotals


class Checkpointer:
    """Saves one Trainer's whole state and loads it back; every method is collective over the
    ranks. A step callback of the Trainer (after_step saves every checkpoint.every steps)."""

    def __init__(self, cfg: RootConfig, run_dir: Path, ctx: DistContext, trainer: Trainer) -> None:
        self.cfg, self.run_dir, self.ctx, self.trainer = cfg, run_dir, ctx, trainer
        self.root = checkpoints_dir(run_dir)
        self.last_saved: tuple[int, Path] | None = None

    @property
    def enabled(self) -> bool:
        return self.cfg.checkpoint.enabled

    # saving

    def before_step(self, step: int) -> None:
        del step

    def after_step(self, step: int) -> None:
        every = self.cfg.checkpoint.every
        if self.enabled and every and step % every == 0 and step < self.cfg.train.steps:
            self.save()

    def save_final(self) -> Path | None:
        """At the end of training, or at a graceful stop; nothing new when this step is saved."""
        if not self.enabled:
            return None
        self.trainer.flush()
        if self.last_saved is not None and self.last_saved[0] == self.trainer.step:
            return self.last_saved[1]
        return self.save()

    def stop(self, reason: str | None) -> Path | None:
        """A graceful stop: save this step, leave stopped.json, and only then let the ranks exit
        (torchrun may restart the others as soon as one exits; they must find the marker)."""
        saved = self.save_final()
        if self.ctx.is_main:
            write_stopped(self.run_dir, self.trainer.step, saved, reason)
            where = f"saved {saved}" if saved else "nothing saved (checkpoint.enabled=false)"
            log.warning(
                f"stopped after step {self.trainer.step} of {self.cfg.train.steps}, {where}. "
                f"Run the same command to resume (exit status {STOPPED_RESUMABLE})."
            )
        _barrier()
        return saved

    def save(self) -> Path:
        # The step in flight is logged first: metrics.jsonl and the saved totals include it.
        self.trainer.flush()
        step, ctx, engine = self.trainer.step, self.ctx, self.trainer.engine
        tmp, final = self.root / f"{TMP_PREFIX}{step}", self.root / f"{STEP_PREFIX}{step}"
        started = time.perf_counter()
        if ctx.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # a save of this step that was interrupted
            tmp.mkdir()
        _barrier()
        meta = self._meta(step)
        engine.save_checkpoint(tmp / ENGINE_DIR, meta)
        (tmp / RNG_DIR).mkdir(parents=True, exist_ok=True)
        with open(tmp / RNG_DIR / f"rank_{ctx.rank}.pt", "wb") as f:
            torch.save(rng_state(ctx.device), f)
            f.flush()
            os.fsync(f.fileno())
        _barrier()  # every rank's files are closed before the marker lists them
        if ctx.is_main:
            write_synced(tmp / META, json.dumps(meta, indent=2) + "\n")
            write_synced(
                tmp / MARKER, json.dumps({"step": step, "files": manifest(tmp)}, indent=2) + "\n"
            )
            commit(tmp, final)
            prune(self.run_dir, self.cfg.checkpoint.keep, final)
            log.info(f"saved checkpoint {final} ({time.perf_counter() - started:.1f}s)")
        _barrier()  # nobody moves on (or exits) before the checkpoint is in place
        self.last_saved = (step, final)
        return final

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
        }

    # resuming

    def resume(self, restarted: bool = False) -> ResumeState | None:
        """Load the checkpoint train.resume asks for (trying older ones if one fails to load)
        into the engine and the RNGs; the step and totals to continue from (None: start)."""
        candidates = resume_candidates(
            self.cfg, self.run_dir, restarted=restarted, warn=self.ctx.is_main
        )
        for ckpt in candidates:
            check_compatible(ckpt.meta, self.cfg, ckpt.path)
            if self._load(ckpt):
                return self._resumed(ckpt)
            if self.ctx.is_main:
                log.warning(f"skipping checkpoint {ckpt.path}: it could not be loaded (see above).")
        if candidates:
            names = ", ".join(str(c.path) for c in candidates)
            raise LauncherError(
                f"train.resume: no checkpoint could be loaded ({names}). Fix: remove the damaged "
                "ones, pass an intact one as train.resume=PATH, or start over with "
                "train.resume=never checkpoint.overwrite=true."
            )
        return None

    def _load(self, ckpt: Checkpoint) -> bool:
        ctx = self.ctx
        ok = True
        try:
            self.trainer.engine.load_checkpoint(ckpt.path / ENGINE_DIR)
            rng_file = ckpt.path / RNG_DIR / f"rank_{ctx.rank}.pt"
            if ckpt.meta.get("world_size") == ctx.world_size:
                set_rng_state(torch.load(rng_file, weights_only=True), ctx.device)
            else:
                reseed(self.cfg.train.seed, ctx.rank, ckpt.step)
        except (Exception, CheckpointException) as exc:  # damaged files: every rank learns below
            log.warning(f"loading {ckpt.path} failed: {type(exc).__name__}: {exc}")
            ok = False
        return _all_ranks(ok, ctx.device)

    def _resumed(self, ckpt: Checkpoint) -> ResumeState:
        step = ckpt.step
        self.last_saved = (step, ckpt.path)
        if self.ctx.is_main:
            was = ckpt.meta.get("world_size")
            note = ""
            if was != self.ctx.world_size:
                note = (
                    f" on {self.ctx.world_size} rank(s) instead of {was} (resharded; dropout "
                    "streams are reseeded)"
                )
            log.info(f"resuming from {ckpt.path} after step {step}{note}.")
            if step >= self.cfg.train.steps:
                log.info(
                    f"the checkpoint is at step {step} of train.steps={self.cfg.train.steps}: nothing left to train."
                )
        return ResumeState(ckpt, step, RunTotals.from_saved(ckpt.meta.get("totals", {})))
