"""What `launch train` and `launch plan` do, as functions tests call directly.

Both validate, build the complete plan and write the run directory (launcher/prepare.py, which
`launch verify` shares); `launch train` then hands the plan to its runner (launcher/runners/),
`launch plan` prints it. Both hold the run directory's lock (launcher/lifetime.py) from before
they write anything: `launch plan` while it writes, `launch train` until the run has ended (a
SLURM job takes it in the job).
"""

from __future__ import annotations

from pathlib import Path

from launcher.checkpoint.preflight import start_fresh
from launcher.config.root import RootConfig
from launcher.lifetime import RunLock
from launcher.logs import get_logger, mark
from launcher.plan import Plan
from launcher.prepare import prepare_run
from launcher.rundir import CONFIG_FILE, PLAN_FILE

log = get_logger("launch")


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
        mark("planned")
        if runner.first_node:  # cluster=torchrun: node 0 alone changes the shared directory
            start_fresh(cfg, run_dir)  # train.resume=never: a new wandb run (overwrite=true)
        if cfg.verify.first and not runner.verifies_in_job:  # else the job does (train.sbatch)
            from launcher.verify.command import verify_before_training

            code = verify_before_training(cfg, run_dir)
            if code:
                return code
        if not runner.holds_run_lock:
            lock.release()  # the job takes it where it runs
        code = runner.run(cfg, run_dir, plan)
        if code == 0 and cfg.export.at_end and runner.first_node:  # one node exports
            from launcher.export.command import export_at_end

            export_at_end(cfg, run_dir)
        return code
    finally:
        lock.release()
