"""What `launch train`, `launch plan` and `launch verify` do before a run starts: check the
config against this machine, build the complete plan, write the run directory.

The commands (launcher/commands.py, launcher/verify/command.py) and the SLURM job's verify step
(launcher/verify/job.py) call it; it calls none of them.
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.checkpoint.preflight import check_resume
from launcher.config.load import to_plain, to_yaml
from launcher.config.root import RootConfig
from launcher.data.build import prepare_data
from launcher.engines import engine_spec
from launcher.errors import ConfigError
from launcher.lifetime import RunLock
from launcher.logs import get_logger
from launcher.plan import Plan, build_plan
from launcher.rundir import CONFIG_FILE, HYDRA_DIR, PLAN_FILE, STARTED_MARKS, check_own_files
from launcher.runners import Runner, runner_for
from launcher.secrets import REDACTED, changed_keys, redact_tree, redactor_for
from launcher.tracking.sinks import check_trackers
from launcher.tracking.wandb_run import check_wandb
from launcher.userpath import replace_own

log = get_logger("launch")


def check_environment(cfg: RootConfig, runner: Runner | None = None) -> RootConfig:
    """Runtime checks that need this machine: devices, data files. Returns cfg with absolute
    paths."""
    cfg = prepare_data(cfg)  # absolute paths; every data file read and checked once
    check_engine(cfg, runner or runner_for(cfg))
    return cfg


def check_engine(cfg: RootConfig, runner: Runner) -> None:
    """What the engine refuses on the ranks' devices."""
    device_type = runner.check_environment(cfg)
    if device_type is not None:  # None: the ranks run elsewhere (SLURM), on devices unseen here
        engine_spec(cfg.engine.name).check_environment(cfg, device_type)


PLAN_REFUSAL = (
    "run",
    "`launch plan` would overwrite the config.yaml that resuming or requeueing it reads.",
    "plan into a new directory (hydra.run.dir=...), or use `launch train` to resume it.",
)


def refuse_started_run(run_dir: Path, refusal: tuple[str, str, str] = PLAN_REFUSAL) -> None:
    """A dry run never touches a run that has trained: its config.yaml is what a resumed or
    requeued job reads. refusal: (what the directory holds, what the command would do, the fix)."""
    started = [name for name in STARTED_MARKS if (run_dir / name).exists()]
    if started:
        holds, harm, fix = refusal
        raise ConfigError(
            "hydra.run.dir",
            f"{run_dir} holds a {holds} that has started ({', '.join(started)}); {harm}",
            fix,
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
    replace_own(run_dir / CONFIG_FILE, secrets.text(to_yaml(cfg)))
    plan_json = json.dumps(secrets.data(plan.to_json()), indent=2)
    replace_own(run_dir / PLAN_FILE, plan_json + "\n")
    redact_tree(run_dir / HYDRA_DIR, secrets)  # Hydra's copies of the config and overrides
    for name, text in plan.files.items():  # redacted already, by build_plan
        # a script (train.sbatch): executable
        replace_own(run_dir / name, text, bits=0o755 if text.startswith("#!") else None)


def prepare_run(
    cfg: RootConfig, run_dir: Path, lock: RunLock, dry_run: bool = False, verifying: bool = False
) -> tuple[RootConfig, Runner, Plan]:
    """Choose the runner, validate against this machine, take the run directory's lock (a run
    still going there is refused, named), build the complete plan (every check raises here,
    before anything is written), then write the run directory. verifying: `launch verify`, a dry
    run of training whose split runs on every node of the job (cluster=torchrun: they meet)."""
    runner = runner_for(cfg)
    runner.launch_command = "verify" if verifying else "train"
    cfg = runner.resolve(cfg, run_dir)  # cluster=torchrun: values from the node's environment
    cfg = check_environment(cfg, runner)
    cfg = check_wandb(cfg)
    cfg = check_trackers(cfg)
    if cfg.eval.harness.every and not dry_run:  # evaluation during training: lm-eval, early
        from launcher.harness.evaluate import include_dir, require_lm_eval

        require_lm_eval()
        include_dir(cfg.eval.harness)
    # cluster=torchrun: node 0 prepares the directory; the job's other nodes only read it
    first = runner.claim_run_dir(cfg, dry_run and not verifying)
    if first:
        lock.job = runner.lock_holder()
        lock.acquire()  # before reading what is there: another run may be writing it
        check_own_files(run_dir)  # a link where the launcher writes: refused, nothing written
        if dry_run:
            refuse_started_run(run_dir)
        cfg = check_resume(cfg, run_dir)  # a refused resume fails here, before anything is written
    plan = build_plan(cfg, run_dir, runner)
    cfg = plan.config or cfg  # batch.micro_size=auto, ac=auto: the chosen values the ranks run
    if plan.memory_choice is not None:  # auto may have chosen an engine option (offload)
        check_engine(cfg, runner)
    if first:
        write_run_files(cfg, run_dir, plan)
    return cfg, runner, plan
