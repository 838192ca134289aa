"""Several ranks on this node through torchrun (`python -m torch.distributed.run`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.config.root import RootConfig
from launcher.exit_codes import STOPPED_RESUMABLE
from launcher.logs import get_logger
from launcher.rundir import (
    CONFIG_FILE,
    clear_rank_errors,
    clear_stopped,
    rank_error_files,
    read_stopped,
)
from launcher.runners.local import LocalRunner, local_cpu_count
from launcher.runners.signals import forward_stop_signals

if TYPE_CHECKING:
    from launcher.plan import Plan

log = get_logger("torchrun")


def torchrun_argv(cfg: RootConfig, config_path: Path) -> list[str]:
    """The exact command `launch train` runs (and `launch plan` prints).

    --standalone puts the rendezvous on a free port, so runs on one machine never collide.
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={cfg.parallel.ranks_per_node}",
        f"--max_restarts={cfg.train.max_restarts}",
        "--monitor_interval=0.5",
        "-m",
        "launcher.worker",
        str(config_path),
    ]


def environment_additions(cfg: RootConfig) -> dict[str, str]:
    """What the ranks' environment gets on top of this one (unless already set); `launch plan`
    shows it next to the command."""
    extra = {
        # Share the cores instead of oversubscribing them (torchrun would pick 1 and warn).
        "OMP_NUM_THREADS": str(max(1, local_cpu_count() // cfg.parallel.ranks_per_node)),
        "PYTHONUNBUFFERED": "1",
    }
    if cfg.train.max_restarts > 0:
        # torchrun's shared rendezvous store keeps the killed ranks' addresses, and restarted
        # ranks would dial them (pytorch/pytorch#135712): give every attempt a fresh store.
        extra["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return {key: value for key, value in extra.items() if key not in os.environ}


def report_failed_ranks(run_dir: Path) -> None:
    for rank, path in rank_error_files(run_dir):
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        last = lines[-1] if lines else "(no message)"
        log.error(f"rank {rank} failed: {last}  (traceback: {path})")


class TorchrunRunner(LocalRunner):
    name = "torchrun"

    def command(self, cfg: RootConfig, run_dir: Path) -> list[str]:
        return torchrun_argv(cfg, run_dir / CONFIG_FILE)

    def environment(self, cfg: RootConfig) -> dict[str, str]:
        return environment_additions(cfg)

    def run(self, cfg: RootConfig, run_dir: Path, plan: Plan) -> int:
        del cfg  # the ranks read config.yaml
        return run_torchrun(run_dir, plan.command, plan.env)


def run_torchrun(run_dir: Path, argv: list[str], env: dict[str, str]) -> int:
    """Run the planned torchrun command with the planned environment additions."""
    clear_rank_errors(run_dir)
    clear_stopped(run_dir)
    # A session of its own: a stop signal for `launch` reaches each rank once, through the
    # forwarder, and never also straight from the terminal or a process-group kill.
    proc = subprocess.Popen(argv, env={**os.environ, **env}, start_new_session=True)
    with forward_stop_signals(proc.pid) as forwarder:
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            code = proc.wait()
    if read_stopped(run_dir) is not None:
        return STOPPED_RESUMABLE  # stopped on a signal after a checkpoint (rank 0 said where)
    if forwarder.terms >= 2:
        log.warning(
            "stopped at once (a second SIGTERM); a rerun resumes from the last complete checkpoint."
        )
        return 128 + signal.SIGTERM
    if code != 0:
        report_failed_ranks(run_dir)
        log.error(f"the job failed with exit status {code}.")
    return code
