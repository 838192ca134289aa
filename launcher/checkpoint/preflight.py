"""What `launch` checks and does to a run's checkpoints before any rank starts: refuse a resume
that cannot work (a changed config or data, checkpoints a fresh start would overwrite) and clear
the earlier state when asked to start over."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from launcher.checkpoint.compat import check_compatible
from launcher.checkpoint.files import STEP_PREFIX, checkpoints_dir, log, resume_candidates
from launcher.config.root import RootConfig
from launcher.errors import ConfigError
from launcher.integrity.data import check_data_unchanged
from launcher.models.adapted import BASE_KEY, check_base, file_base_identity
from launcher.rundir import METRICS_FILE, SUMMARY_FILE, WANDB_DIR, WANDB_RUN_ID_FILE


def check_resume(cfg: RootConfig, run_dir: Path) -> RootConfig:
    """Refuse, before anything runs or is written, what resuming cannot do; make a PATH absolute."""
    mode = cfg.train.resume
    if mode == "never":
        root = checkpoints_dir(run_dir)
        held = (
            sorted(p.name for p in root.iterdir() if p.name.startswith(STEP_PREFIX))
            if root.is_dir()
            else []
        )
        if held and not cfg.checkpoint.overwrite:
            raise ConfigError(
                ["train.resume", "checkpoint.overwrite"],
                f"train.resume=never, but {run_dir} holds checkpoints ({', '.join(held)}) that a "
                "fresh start would overwrite.",
                "resume them (train.resume=auto), choose another hydra.run.dir, or add "
                "checkpoint.overwrite=true to delete them and start over.",
            )
        return cfg
    if mode != "auto":
        path = str(Path(mode).expanduser().resolve())
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, resume=path))
    candidates = resume_candidates(cfg, run_dir, restarted=False, warn=False)
    if candidates:
        check_compatible(candidates[0].meta, cfg, candidates[0].path)
        # An adapter run's base from weight files: the same files (a random init: on the ranks).
        check_base(candidates[0].meta.get(BASE_KEY), file_base_identity(cfg), candidates[0].path)
        check_data_unchanged(
            candidates[0].meta.get("data"),
            cfg.data,
            candidates[0].path,
            allowed=cfg.checkpoint.allow_data_change,
        )
    return cfg


def start_fresh(cfg: RootConfig, run_dir: Path) -> None:
    """train.resume=never: training starts at step 1, so it is a new wandb run (the run id kept in
    the run directory is forgotten; the earlier run's wandb files stay). With
    checkpoint.overwrite=true also remove the earlier run's checkpoints and metrics."""
    if cfg.train.resume != "never":
        return
    run_id = run_dir / WANDB_DIR / WANDB_RUN_ID_FILE
    if run_id.is_file() or run_id.is_symlink():
        run_id.unlink()  # what an earlier launch wrote; a link is removed, never followed
        log.info(f"train.resume=never: a new wandb run starts (forgot {run_id})")
    if not cfg.checkpoint.overwrite:
        return
    root = checkpoints_dir(run_dir)
    if root.is_dir():
        log.warning(f"checkpoint.overwrite=true: deleting {root} and the earlier metrics.")
        shutil.rmtree(root)
    for name in (METRICS_FILE, SUMMARY_FILE):
        (run_dir / name).unlink(missing_ok=True)
