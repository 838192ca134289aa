"""What `launch train` and `launch plan` do, as functions tests call directly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from launcher.checkpoint.files import check_resume, start_fresh
from launcher.config.engine import EngineName
from launcher.config.load import to_plain, to_yaml
from launcher.config.root import RootConfig
from launcher.config.train import Precision
from launcher.data import build_dataset
from launcher.engines.ds_config import ds_config_json
from launcher.errors import ConfigError
from launcher.logs import get_logger
from launcher.plan import Plan, build_plan, local_cpu_count, runner_kind
from launcher.rundir import (
    CONFIG_FILE,
    DS_CONFIG_FILE,
    HYDRA_DIR,
    PLAN_FILE,
    SBATCH_FILE,
    STARTED_MARKS,
)
from launcher.secrets import REDACTED, changed_keys, redact_tree, redactor_for
from launcher.tracking.wandb_run import check_wandb

log = get_logger("launch")


def check_environment(cfg: RootConfig) -> RootConfig:
    """Runtime checks that need this machine: devices, data files. Returns cfg with absolute paths."""
    if cfg.data.path:
        path = Path(cfg.data.path).expanduser().resolve()
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=str(path)))
        build_dataset(cfg.data, cfg.model.seq_len, cfg.train.seed)  # reads and checks the file
    if runner_kind(cfg) == "slurm":
        return cfg
    per_node = cfg.parallel.ranks_per_node
    wants_gpu = cfg.train.device == "cuda" or (
        cfg.train.device == "auto" and torch.cuda.is_available()
    )
    if wants_gpu:
        gpus = torch.cuda.device_count()
        if per_node > gpus:
            raise ConfigError(
                "parallel.dp",
                f"{per_node} ranks on this node but only {gpus} GPU(s).",
                f"set parallel.dp<={gpus}, or run on CPU with train.device=cpu.",
            )
    elif per_node > local_cpu_count():
        log.warning(
            f"parallel.dp={per_node} ranks on {local_cpu_count()} CPU core(s): they will share cores "
            "and run slower (fine for testing)."
        )
    fp16 = cfg.train.precision == Precision.fp16
    if fp16 and cfg.engine.name == EngineName.deepspeed and not wants_gpu:
        raise ConfigError(
            ["train.precision", "engine"],
            "DeepSpeed has no fp16 on CPU (its CPU accelerator supports fp32 and bf16).",
            "use train.precision=bf16 or fp32 here, or run on GPUs.",
        )
    return cfg


def command_for(cfg: RootConfig, run_dir: Path) -> list[str]:
    kind = runner_kind(cfg)
    if kind == "torchrun":
        from launcher.runners.torchrun import torchrun_argv

        return torchrun_argv(cfg, run_dir / CONFIG_FILE)
    if kind == "slurm":
        from launcher.runners.slurm import sbatch_argv

        return sbatch_argv(cfg, run_dir)
    return []


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


def prepare_run(cfg: RootConfig, run_dir: Path, dry_run: bool = False) -> tuple[RootConfig, Plan]:
    """Validate against this machine, then write config.yaml and plan.json (nothing earlier)."""
    if dry_run:
        refuse_started_run(run_dir)
    cfg = check_environment(cfg)
    cfg = check_wandb(cfg)
    cfg = check_resume(cfg, run_dir)  # a refused resume fails here, before anything is written
    plan = build_plan(cfg, command_for(cfg, run_dir))
    if plan.runner == "torchrun":
        from launcher.runners.torchrun import environment_additions

        plan.env = environment_additions(cfg)
    # Generated (and checked against engine.extra) before anything is written.
    ds_config = ds_config_json(cfg) if cfg.engine.name == EngineName.deepspeed else None
    if ds_config is not None:
        plan.files.append(DS_CONFIG_FILE)
    if plan.runner == "slurm":
        plan.files.append(SBATCH_FILE)  # rendered and checked by command_for above
    run_dir.mkdir(parents=True, exist_ok=True)
    # Credentials from the environment or typed into the config never reach the run directory.
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
    if ds_config is not None:
        (run_dir / DS_CONFIG_FILE).write_text(secrets.text(ds_config), encoding="utf-8")
    if plan.runner == "slurm":
        from launcher.runners.slurm import write_sbatch

        write_sbatch(cfg, run_dir)
    return cfg, plan


def plan_command(cfg: RootConfig, run_dir: Path) -> Plan:
    _, plan = prepare_run(cfg, run_dir, dry_run=True)
    log.info(plan.describe())
    if DS_CONFIG_FILE in plan.files:  # the file the run would hand DeepSpeed, byte for byte
        ds_config = (run_dir / DS_CONFIG_FILE).read_text(encoding="utf-8")
        log.info(f"{DS_CONFIG_FILE}:\n{ds_config.rstrip()}")
    if plan.runner == "slurm":  # the script `launch train` would submit, byte for byte
        log.info(f"{SBATCH_FILE}:\n" + (run_dir / SBATCH_FILE).read_text(encoding="utf-8").rstrip())
    written = ", ".join(str(run_dir / name) for name in (CONFIG_FILE, PLAN_FILE, *plan.files))
    log.info(f"wrote {written}; nothing was started.")
    return plan


def train_command(cfg: RootConfig, run_dir: Path) -> int:
    cfg, plan = prepare_run(cfg, run_dir)
    log.info(plan.describe())
    log.info(f"run directory: {run_dir}")
    start_fresh(cfg, run_dir)  # only with train.resume=never checkpoint.overwrite=true
    if plan.runner == "in-process":
        from launcher.worker.run import run_in_process

        return run_in_process(cfg, run_dir)
    if plan.runner == "torchrun":
        from launcher.runners.torchrun import run_torchrun

        return run_torchrun(cfg, run_dir / CONFIG_FILE)
    from launcher.runners.slurm import submit

    return submit(cfg, run_dir)
