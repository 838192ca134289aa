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
from launcher.rundir import METRICS_FILE, SUMMARY_FILE


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
    """train.resume=never with checkpoint.overwrite=true: remove the earlier run's state."""
    if cfg.train.resume != "never" or not cfg.checkpoint.overwrite:
        return
    root = checkpoints_dir(run_dir)
    if root.is_dir():
        log.warning(f"checkpoint.overwrite=true: deleting {root} and the earlier metrics.")
        shutil.rmtree(root)
    for name in (METRICS_FILE, SUMMARY_FILE):
        (run_dir / name).unlink(missing_ok=True)
