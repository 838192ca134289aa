"""What one sweep point needs from the CLI: its wandb group, and a record of why it failed.

Light on purpose (no torch, no matplotlib): `launcher.cli` imports it for every `launch` call.
"""

from __future__ import annotations

import dataclasses
import traceback
from pathlib import Path

from launcher.config.root import RootConfig
from launcher.logs import get_logger
from launcher.rundir import (
    ERROR_FILE,
    HYDRA_DIR,
    MULTIRUN_FILE,
    clear_slurm_job,
    rank_error_files,
)
from launcher.secrets import redact, redact_file, redact_tree
from launcher.userpath import replace_own

log = get_logger("sweep")

"""In a point's run directory: why the point failed (first line: the reason in one line)."""


def sweep_name(sweep_dir: Path) -> str:
    """The sweep's name: its directory's name, with the parent's in front when the name is a
    timestamp (Hydra's default multirun/<date>/<time> gives e.g. 2024-05-01_12-30-00)."""
    sweep_dir = sweep_dir.expanduser().resolve()
    name = sweep_dir.name
    if name[:1].isdigit() and sweep_dir.parent.name:
        return f"{sweep_dir.parent.name}_{name}"
    return name


def join_sweep(cfg: RootConfig, sweep_dir: Path) -> RootConfig:
    """A point's config: wandb groups the sweep's points under the sweep's name unless set."""
    if cfg.wandb.group is not None:
        return cfg
    wandb = dataclasses.replace(cfg.wandb, group=sweep_name(sweep_dir))
    return dataclasses.replace(cfg, wandb=wandb)


def start_point(cfg: RootConfig, run_dir: Path, sweep_dir: Path) -> RootConfig:
    """A sweep point whose config is valid: forget a failure from an earlier attempt in the same
    run directory (a sweep run again to resume it), and join the sweep's wandb group."""
    (run_dir / ERROR_FILE).unlink(missing_ok=True)
    clear_slurm_job(run_dir)  # a job record after this point ends was submitted by this sweep
    return join_sweep(cfg, sweep_dir)


def scrub_secrets(run_dir: Path, sweep_dir: Path) -> None:
    """Hydra writes a point's overrides (and any credential typed into them) to its .hydra/ and to
    the sweep's multirun.yaml before the point runs, whether or not its config is valid."""
    redact_tree(run_dir / HYDRA_DIR)
    redact_file(sweep_dir / MULTIRUN_FILE)


def record_failure(run_dir: Path, reason: str, details: str = "") -> None:
    """Write <run dir>/error.txt; the sweep summary shows its first line as the point's reason."""
    run_dir.mkdir(parents=True, exist_ok=True)
    one_line = " ".join(reason.split())
    text = one_line + "\n" + (f"\n{details.rstrip()}\n" if details else "")
    replace_own(run_dir / ERROR_FILE, redact(text))


def record_crash(run_dir: Path, exc: Exception) -> int:
    """An unexpected exception in an in-process point (e.g. out of memory at a large micro size):
    log it, record it, and let the sweep go on. Returns the point's exit status."""
    log.error(f"this sweep point crashed: {type(exc).__name__}: {exc}", exc_info=exc)
    details = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    record_failure(run_dir, f"{type(exc).__name__}: {exc}", details)
    return 1


def record_exit(run_dir: Path, code: int) -> bool:
    """A point whose job exited non-zero. A failure is recorded (the status and the ranks' errors)
    and the sweep goes on: returns False. A stop on a signal (STOPPED_RESUMABLE) stops the whole
    sweep, as the person or the scheduler asked: returns True; the point resumes from its
    checkpoint when the same sweep runs again with the same hydra.sweep.dir."""
    from launcher.exit_codes import STOPPED_RESUMABLE

    if code == STOPPED_RESUMABLE:
        log.warning(
            f"the sweep stops: {run_dir.name} was stopped on a signal after a checkpoint. Run the "
            f"same command with hydra.sweep.dir={run_dir.parent} to resume it and the rest."
        )
        return True
    record_failure(run_dir, f"the job failed with exit status {code}" + rank_reasons(run_dir))
    return False


def rank_reasons(run_dir: Path) -> str:
    """The last line of the first two failed ranks' errors, as " (rank 0: ...; rank 1: ...)"; ""
    when no rank left one."""
    details = []
    for rank, path in rank_error_files(run_dir):
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if lines:
            details.append(f"rank {rank}: {lines[-1]}")
    if not details:
        return ""
    return " (" + "; ".join(details[:2]) + ("; ..." if len(details) > 2 else "") + ")"
