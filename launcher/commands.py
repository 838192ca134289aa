"""What `launch train` and `launch plan` do, as functions tests call directly.

Both validate, build the complete plan (launcher/plan.py) and write the run directory; `launch
train` then hands the plan to its runner (launcher/runners/), `launch plan` prints it. Both hold
the run directory's lock (launcher/lifetime.py) from before they write anything: `launch plan`
while it writes, `launch train` until the run has ended (a SLURM job takes it in the job).
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.checkpoint.files import check_resume, start_fresh
from launcher.config.load import to_plain, to_yaml
from launcher.config.root import RootConfig
from launcher.data.build import prepare_data
from launcher.engines import engine_spec
from launcher.errors import ConfigError
from launcher.lifetime import RunLock
from launcher.logs import get_logger
from launcher.plan import Plan, build_plan
from launcher.rundir import CONFIG_FILE, HYDRA_DIR, PLAN_FILE, STARTED_MARKS
from launcher.runners import Runner, runner_for
from launcher.secrets import REDACTED, changed_keys, redact_tree, redactor_for
from launcher.tracking.wandb_run import check_wandb

log = get_logger("launch")


def check_environment(cfg: RootConfig, runner: Runner | None = None) -> RootConfig:
    """Runtime checks that need this machine: devices, data files. Returns cfg with absolute
    paths."""
    cfg = prepare_data(cfg)  # absolute paths; every data file read and checked once
    device_type = (runner or runner_for(cfg)).check_environment(cfg)
    if device_type is not None:  # None: the ranks run elsewhere (SLURM), on devices unseen here
        engine_spec(cfg.engine.name).check_environment(cfg, device_type)
    return cfg


def refuse_started_run(run_dir: Path) -> None:
    """A dry run never touches a run that has trained: its config.yaml is what a resumed or
    requeued job reads."""
    started = [name for name in STARTED_MARKS if (run_dir / name).exists()]
    if started:
        raise ConfigError(
            "hydra.run.dir",
            f"{run_dir} holds a run that has started ({', '.join(started)}); `launch plan` would "
            "overwrite the config.yaml that resuming or requeueing it reads.",
            "plan into a new directory (hydra.run.dir=...), or use `launch train` to resume it.",
        )


def write_run_files(cfg: RootConfig, run_dir: Path, plan: Plan) -> None:
    """config.yaml, plan.json and the plan's files; credentials never reach the run directory."""
    run_dir.mkdir(parents=True, exist_ok=True)
    plain = to_plain(cfg)
    secrets = redactor_for(plain)
    redacted = changed_keys(plain, secrets.data(plain))
    if redacted:
        log.warning(
            f"{', '.join(redacted)}: holds a credential, written to {CONFIG_FILE} as {REDACTED} "
            "(the ranks read that file too). Fix: pass credentials through the environment."
        )
    (run_dir / CONFIG_FILE).write_text(secrets.text(to_yaml(cfg)), encoding="utf-8")
    plan_json = json.dumps(secrets.data(plan.to_json()), indent=2)
    (run_dir / PLAN_FILE).write_text(plan_json + "\n", encoding="utf-8")
    redact_tree(run_dir / HYDRA_DIR, secrets)  # Hydra's copies of the config and overrides
    for name, text in plan.files.items():  # redacted already, by build_plan
        path = run_dir / name
        path.write_text(text, encoding="utf-8")
        if text.startswith("#!"):
            path.chmod(0o755)  # a script (train.sbatch)


def prepare_run(
    cfg: RootConfig, run_dir: Path, lock: RunLock, dry_run: bool = False
) -> tuple[RootConfig, Runner, Plan]:
    """Choose the runner, validate against this machine, take the run directory's lock (a run
    still going there is refused, named), build the complete plan (every check raises here,
    before anything is written), then write the run directory."""
    runner = runner_for(cfg)
    cfg = check_environment(cfg, runner)
    cfg = check_wandb(cfg)
    lock.acquire()  # before reading what is there: another run may be writing it
    if dry_run:
        refuse_started_run(run_dir)
    cfg = check_resume(cfg, run_dir)  # a refused resume fails here, before anything is written
    plan = build_plan(cfg, run_dir, runner)
    cfg = plan.config or cfg  # batch.micro_size=auto, ac=auto: the chosen values the ranks run
    write_run_files(cfg, run_dir, plan)
    return cfg, runner, plan


def plan_command(cfg: RootConfig, run_dir: Path) -> Plan:
    lock = RunLock(run_dir)
    try:
        _, _, plan = prepare_run(cfg, run_dir, lock, dry_run=True)
    finally:
        lock.release()
    log.info(plan.describe())
    for name, text in plan.files.items():  # what the run would use, byte for byte
        log.info(f"{name}:\n{text.rstrip()}")
    written = ", ".join(str(run_dir / name) for name in (CONFIG_FILE, PLAN_FILE, *plan.files))
    log.info(f"wrote {written}; nothing was started.")
    return plan


def train_command(cfg: RootConfig, run_dir: Path) -> int:
    lock = RunLock(run_dir)
    try:
        cfg, runner, plan = prepare_run(cfg, run_dir, lock)
        log.info(plan.describe())
        log.info(f"run directory: {run_dir}")
        start_fresh(cfg, run_dir)  # only with train.resume=never checkpoint.overwrite=true
        if cfg.verify.first and runner.name != "slurm":  # on SLURM the job verifies (train.sbatch)
            from launcher.verify.command import verify_before_training

            code = verify_before_training(cfg, run_dir)
            if code:
                return code
        if not runner.holds_run_lock:
            lock.release()  # the job takes it where it runs
        code = runner.run(cfg, run_dir, plan)
        if code == 0 and cfg.export.at_end:
            from launcher.export.command import export_at_end

            export_at_end(cfg, run_dir)
        return code
    finally:
        lock.release()
