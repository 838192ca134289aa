"""What `launch train` and `launch plan` do, as functions tests call directly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from launcher.config.load import to_yaml
from launcher.config.root import RootConfig
from launcher.data import build_dataset
from launcher.errors import ConfigError
from launcher.logs import get_logger
from launcher.plan import Plan, build_plan, local_cpu_count, runner_kind

log = get_logger("launch")

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.json"


def check_environment(cfg: RootConfig) -> RootConfig:
    """Runtime checks that need this machine: devices, data files. Returns cfg with absolute paths."""
    if cfg.data.path:
        path = Path(cfg.data.path).expanduser().resolve()
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=str(path)))
        build_dataset(cfg.data, cfg.model.seq_len, cfg.train.seed)  # reads and checks the file
    if runner_kind(cfg) == "slurm":
        return cfg
    per_node = cfg.parallel.ranks_per_node
    wants_gpu = cfg.train.device == "cuda" or (cfg.train.device == "auto" and torch.cuda.is_available())
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


def prepare_run(cfg: RootConfig, run_dir: Path) -> tuple[RootConfig, Plan]:
    """Validate against this machine, then write config.yaml and plan.json (nothing earlier)."""
    cfg = check_environment(cfg)
    plan = build_plan(cfg, command_for(cfg, run_dir))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(to_yaml(cfg), encoding="utf-8")
    (run_dir / PLAN_FILE).write_text(json.dumps(plan.to_json(), indent=2) + "\n", encoding="utf-8")
    if plan.runner == "slurm":
        from launcher.runners.slurm import write_sbatch

        write_sbatch(cfg, run_dir)
    return cfg, plan


def plan_command(cfg: RootConfig, run_dir: Path) -> Plan:
    _, plan = prepare_run(cfg, run_dir)
    log.info(plan.describe())
    log.info(f"wrote {run_dir / CONFIG_FILE} and {run_dir / PLAN_FILE}; nothing was started.")
    return plan


def train_command(cfg: RootConfig, run_dir: Path) -> int:
    cfg, plan = prepare_run(cfg, run_dir)
    log.info(plan.describe())
    log.info(f"run directory: {run_dir}")
    if plan.runner == "in-process":
        from launcher.worker.run import run_worker

        run_worker(cfg, run_dir)
        return 0
    if plan.runner == "torchrun":
        from launcher.runners.torchrun import run_torchrun

        return run_torchrun(cfg, run_dir / CONFIG_FILE)
    from launcher.runners.slurm import submit

    return submit(cfg, run_dir)
