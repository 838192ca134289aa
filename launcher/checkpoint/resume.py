"""Resuming a job: the checkpoint train.resume asks for is loaded into the engine and the RNGs by
every rank together, older ones tried when one fails to load, and the step and totals to go on
from are returned. Which samples a step reads depends on the step number only, so the step is the
sampler's whole position; DCP reshards the model and optimizer when dp changed."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from launcher.checkpoint.collective import attempt, every_rank, is_dcp_error
from launcher.checkpoint.compat import check_compatible
from launcher.checkpoint.files import (
    ENGINE_DIR,
    RNG_DIR,
    Checkpoint,
    damaged_file,
    none_loads,
    resume_candidates,
)
from launcher.checkpoint.rng import reseed, set_rng_state
from launcher.config.root import RootConfig
from launcher.logs import get_logger
from launcher.models.adapted import BASE_KEY, check_base
from launcher.tracking.metrics import RunTotals

if TYPE_CHECKING:
    from launcher.distributed import DistContext
    from launcher.engines.base import Engine

log = get_logger("checkpoint")


@dataclasses.dataclass(frozen=True)
class ResumeState:
    """Where a resumed run continues: after `step`, with the run's totals so far."""

    checkpoint: Checkpoint
    step: int
    totals: RunTotals


def load_resume_state(
    cfg: RootConfig,
    run_dir: Path,
    ctx: DistContext,
    engine: Engine,
    restarted: bool = False,
    base: dict[str, Any] | None = None,
) -> ResumeState | None:
    """Collective: load the checkpoint train.resume asks for (trying older ones if one fails to
    load); the step and totals to continue from (None: start from step 1)."""
    candidates = resume_candidates(cfg, run_dir, restarted=restarted, warn=ctx.is_main)
    # `launch` judged the newest before the ranks started (checkpoint/preflight.py) and said
    # what it had to say; a restarted or requeued attempt had no such check.
    judged = candidates[0].path if candidates and not restarted else None
    failed: list[tuple[Path, str]] = []
    for ckpt in candidates:
        check_compatible(ckpt.meta, cfg, ckpt.path, warn=ctx.is_main and ckpt.path != judged)
        check_base(ckpt.meta.get(BASE_KEY), base, ckpt.path)  # adapters: the same base weights
        problem = _load(ckpt, cfg, ctx, engine)
        if problem is None:
            return _resumed(ckpt, cfg, ctx)
        failed.append((ckpt.path, problem))
        if ctx.is_main:
            log.warning(f"skipping checkpoint {ckpt.path}: {problem}.")
    if failed:
        raise none_loads(run_dir, failed)
    return None


def load_cause(exc: BaseException) -> str:
    """The first line of what went wrong; for DCP's gathered errors, the first rank's."""
    failures = getattr(exc, "failures", None)
    if is_dcp_error(exc) and isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        exc = first[0] if isinstance(first, tuple) else first
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    if "weights_only" in first or "Weights only load failed" in first:
        # torch's advice (load with weights_only=False) would trade safety for a damaged file.
        first = "the file does not hold the tensors that were saved (damaged)"
    return f"{type(exc).__name__}: {first[:400]}"


def _load(ckpt: Checkpoint, cfg: RootConfig, ctx: DistContext, engine: Engine) -> str | None:
    """Load on every rank; None when every rank loaded it, else what went wrong."""
    # One rank reads every file against its digest; all skip a damaged checkpoint together.
    problem = damaged_file(ckpt.path) if ctx.is_main else None
    if not every_rank(problem is None, ctx.device):
        return problem or "it is damaged (found by rank 0)"

    def load() -> None:
        engine.load_checkpoint(ckpt.path / ENGINE_DIR)
        rng_file = ckpt.path / RNG_DIR / f"rank_{ctx.rank}.pt"
        if ckpt.meta.get("world_size") == ctx.world_size:
            set_rng_state(torch.load(rng_file, weights_only=True), ctx.device)
        else:
            reseed(cfg.train.seed, ctx.rank, ckpt.step)

    error = attempt(load)  # damaged files (DCP's gathered error too): every rank learns below
    if error is not None:
        problem = f"it could not be loaded ({load_cause(error)})"
    if every_rank(problem is None, ctx.device):
        return None
    return problem or "it could not be loaded on another rank"


def _resumed(ckpt: Checkpoint, cfg: RootConfig, ctx: DistContext) -> ResumeState:
    step = ckpt.step
    if ctx.is_main:
        was = ckpt.meta.get("world_size")
        note = ""
        if was != ctx.world_size:
            note = (
                f" on {ctx.world_size} rank(s) instead of {was} (resharded; dropout "
                "streams are reseeded)"
            )
        log.info(f"resuming from {ckpt.path} after step {step}{note}.")
        if step >= cfg.train.steps:
            log.info(
                f"the checkpoint is at step {step} of train.steps={cfg.train.steps}: "
                "nothing left to train."
            )
    return ResumeState(ckpt, step, RunTotals.from_saved(ckpt.meta.get("totals", {})))
