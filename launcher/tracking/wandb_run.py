"""Weights & Biases: a check before anything starts, then one run on rank 0 (offline by default).

The run id is kept in <run dir>/wandb/run_id.txt and passed back with resume="allow", so a job
that is stopped and launched again into the same run directory (a resume, a SLURM requeue)
continues the same wandb run. Run files go under <run dir>/wandb/.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import netrc
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from launcher.config.load import to_plain
from launcher.config.root import RootConfig
from launcher.config.tracking import Backend
from launcher.config.wandb import WandbMode
from launcher.errors import ConfigError
from launcher.exit_codes import STOPPED_RESUMABLE
from launcher.logs import get_logger
from launcher.rundir import WANDB_DIR, WANDB_RUN_ID_FILE
from launcher.secrets import Redactor, redact, redactor_for
from launcher.userpath import refuse_link, replace_own

log = get_logger("wandb")

DEFAULT_HOST = "https://api.wandb.ai"

_NO_WANDB_FIX = (
    "set wandb.mode=disabled to train without it, or wandb.required=false to warn and continue."
)


def _import_problem() -> str | None:
    try:
        importlib.import_module("wandb")
    except Exception as exc:  # a broken install raises anything, not only ImportError
        return f"wandb cannot be imported ({type(exc).__name__}: {exc})."
    return None


def has_credentials(env: dict[str, str] | None = None) -> bool:
    """An API key in the environment, an identity-token file, or `wandb login`'s netrc entry.

    Looked up without the network (wandb itself would prompt or try to connect).
    """
    env = dict(os.environ) if env is None else env
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(env.get("WANDB_BASE_URL") or DEFAULT_HOST).hostname or ""
    path = (
        Path(env["NETRC"])
        if env.get("NETRC")
        else Path(env.get("HOME", "~")).expanduser() / ".netrc"
    )
    try:
        return path.is_file() and netrc.netrc(path).authenticators(host) is not None
    except (netrc.NetrcParseError, OSError):
        return False


def _fail(cfg: RootConfig, problem: str, fix: str) -> None:
    """One clear error (wandb.required), or a warning when training may go on without wandb."""
    if cfg.wandb.required:
        raise ConfigError(["wandb.mode", "wandb.required"], problem, fix)
    log.warning(f"{problem} Training continues without wandb (wandb.required=false).")


def wandb_off(cfg: RootConfig) -> bool:
    """wandb.mode=disabled, or wandb left out of tracking.backends."""
    return cfg.wandb.mode == WandbMode.disabled or not cfg.tracking.uses(Backend.wandb)


def check_wandb(cfg: RootConfig) -> RootConfig:
    """Before anything starts: wandb imports, and online mode has credentials.

    Returns cfg, with wandb disabled when it cannot work and wandb.required=false (so the ranks
    do not try again).
    """
    if wandb_off(cfg):
        return cfg
    problem = _import_problem()
    fix = f"reinstall it (pip install 'wandb>=0.17'); or {_NO_WANDB_FIX}"
    if problem is None and cfg.wandb.mode == WandbMode.online and not has_credentials():
        problem = (
            "wandb.mode=online needs a W&B API key, and none was found (WANDB_API_KEY, ~/.netrc)."
        )
        fix = (
            "export WANDB_API_KEY=<your key> or run `wandb login`; or use wandb.mode=offline and "
            f"upload later with `wandb sync <run dir>/wandb/offline-run-*`; or {_NO_WANDB_FIX}"
        )
    if problem is None:
        return cfg
    _fail(cfg, problem, fix)
    return dataclasses.replace(cfg, wandb=dataclasses.replace(cfg.wandb, mode=WandbMode.disabled))


def run_id(run_dir: Path) -> str:
    """The run directory's wandb run id: read when present, else created and stored."""
    path = run_dir / WANDB_DIR / WANDB_RUN_ID_FILE
    refuse_link(path)  # neither read nor written through a link
    if path.is_file():
        stored = path.read_text(encoding="utf-8").strip()
        if stored:
            return stored
    path.parent.mkdir(parents=True, exist_ok=True)
    new = uuid.uuid4().hex[:12]
    replace_own(path, new + "\n")
    return new


@contextlib.contextmanager
def _redacted_argv(secrets: Redactor) -> Iterator[None]:
    """wandb records sys.argv; an in-process launch's argv holds the user's overrides."""
    saved = list(sys.argv)
    sys.argv[:] = secrets.data(saved)
    try:
        yield
    finally:
        sys.argv[:] = saved


def init_arguments(
    cfg: RootConfig, run_dir: Path, derived: dict[str, Any]
) -> tuple[dict[str, Any], Redactor]:
    """What wandb.init receives that comes from the user (config, project, name, group, tags),
    with every credential redacted by the rules that clean config.yaml: a secret typed into
    wandb.name or wandb.tags reaches neither the run file nor the dashboard. Also the redactor,
    for the rest of what wandb records (sys.argv)."""
    w = cfg.wandb
    config = {**to_plain(cfg), "derived": derived}
    # The environment's secrets, those assigned inside any config value, and those on the
    # command line (a sweep point's argv holds every override).
    secrets = redactor_for([config, list(sys.argv)])
    return {
        "project": secrets.text(w.project),
        "entity": None if w.entity is None else secrets.text(w.entity),
        "name": secrets.text(w.name or run_dir.name),
        "group": None if w.group is None else secrets.text(w.group),
        "tags": [secrets.text(tag) for tag in w.tags],
        "config": secrets.data(config),
    }, secrets


class WandbRun:
    """The rank-0 wandb run: metrics identical to metrics.jsonl, the summary at the end."""

    def __init__(self, run: Any, offline: bool, files: Path) -> None:
        self.run = run
        self.id: str = run.id
        self.offline = offline
        self.files = files

    @classmethod
    def start(cls, cfg: RootConfig, run_dir: Path, derived: dict[str, Any]) -> WandbRun | None:
        """None when wandb is disabled, or failed to start and wandb.required=false."""
        if wandb_off(cfg):
            return None
        w = cfg.wandb
        try:
            import wandb

            if wandb.run is not None:  # an earlier in-process run (a sweep point) left open
                wandb.finish()
            user, secrets = init_arguments(cfg, run_dir, derived)
            with _redacted_argv(secrets):
                run = wandb.init(
                    **user,
                    dir=str(run_dir),
                    id=run_id(run_dir),
                    resume="allow",
                    mode=w.mode.value,
                    job_type="train",
                    # Its banner, history sparklines and summary table would fill a SLURM log;
                    # the launcher's own line below says where the run is.
                    settings=wandb.Settings(quiet=True, silent=True),
                )
            # Our optimizer step, not wandb's own counter, is the x-axis: a resumed run continues
            # it.
            run.define_metric("step")
            run.define_metric("*", step_metric="step")
        except Exception as exc:
            _fail(
                cfg,
                f"wandb failed to start ({type(exc).__name__}: {exc}).",
                f"check the wandb.* settings and credentials; or {_NO_WANDB_FIX}",
            )
            return None
        files = run_dir / WANDB_DIR
        url = getattr(run, "url", None) if w.mode == WandbMode.online else None
        where = f"{url}, " if url else ""
        log.info(f"wandb run {run.id} ({w.mode.value}), {where}files in {files}")
        return cls(run, w.mode == WandbMode.offline, files)

    def log(self, metrics: dict[str, Any]) -> None:
        if self.run is None:
            return
        try:
            self.run.log(metrics)
        except Exception as exc:  # losing the dashboard must not lose the training run
            log.warning(f"wandb: logging failed ({exc}); metrics.jsonl continues, wandb stops.")
            self.run = None

    def finish(self, summary: dict[str, Any] | None, exit_code: int = 0) -> None:
        if self.run is None:
            return
        run, self.run = self.run, None
        if summary:
            run.summary.update(redact(summary))
        if exit_code == STOPPED_RESUMABLE:
            run.mark_preempting()  # shown as preempted, continued by the next launch
        run.finish(exit_code=exit_code)
        if self.offline:
            log.info(
                f"wandb run {self.id} is offline; upload it with: wandb sync "
                f"{self.files}/offline-run-*"
            )
