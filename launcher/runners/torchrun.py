"""Several ranks on this node through torchrun, whose agent runs inside the `launch` process.

The plan's command is torchrun's command line; `launch train` runs exactly those arguments with
torch's own `torch.distributed.run` in this process (launcher/runners/agent.py) instead of
starting a second Python that would import torch again. The ranks are children of `launch`,
each in a session of its own; `launch` relays stop signals to them (launcher/runners/signals.py)
and they die with it (launcher/worker/__main__.py).
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.config.root import RootConfig
from launcher.exit_codes import COMPLETE_HELD, FAILED, HUNG, STOPPED_RESUMABLE
from launcher.logs import get_logger
from launcher.rundir import (
    AGENT_DIR,
    CONFIG_FILE,
    clear_rank_errors,
    clear_stopped,
    rank_failures_file,
    read_stopped,
)
from launcher.runners.local import LocalRunner, thread_environment

if TYPE_CHECKING:
    from launcher.plan import Plan

log = get_logger("torchrun")

TORCHRUN = "torchrun"
"""The command's first word: torchrun's arguments follow, run by `launch` itself."""
MONITOR_INTERVAL_S = 0.1
"""How often the agent looks at the ranks: the delay between the last rank's exit and the end."""


def torchrun_argv(cfg: RootConfig, run_dir: Path, worker: str = "launcher.worker") -> list[str]:
    """The exact torchrun command `launch train` runs (in its own process) and `launch plan` prints.

    --standalone puts the rendezvous on a free port, so runs on one machine never collide.
    --log-dir keeps torchrun's scratch in the run directory (removed at the end) instead of a
    torchelastic_* directory in the system temp directory. torchrun's agent handles SIGQUIT only:
    `launch` relays SIGTERM, SIGUSR1, SIGINT and SIGHUP to the ranks itself.
    """
    from launcher.runners.agent import handles_signals_option
    from launcher.runners.local_nodes import elastic_args, free_port

    signals = ["--signals_to_handle=SIGQUIT"] if handles_signals_option() else []
    membership = (
        elastic_args(cfg, free_port(), run_dir.name or "launcher")
        if cfg.parallel.nodes > 1  # an elastic job on this machine: one agent per node
        else ["--standalone"]
    )
    return [
        TORCHRUN,
        *membership,
        f"--nproc_per_node={cfg.parallel.ranks_per_node}",
        # one node, whatever PET_NNODES says (torchrun reads PET_* for an argument not given)
        *(["--nnodes=1"] if cfg.parallel.nodes == 1 else []),
        f"--max_restarts={cfg.restarts}",
        f"--monitor_interval={MONITOR_INTERVAL_S}",
        f"--log-dir={run_dir / AGENT_DIR}",
        *signals,
        "-m",
        worker,
        str(run_dir / CONFIG_FILE),
    ]


def environment_additions(cfg: RootConfig) -> dict[str, str]:
    """What the ranks' environment gets on top of this one (unless already set); `launch plan`
    shows it next to the command. A bad LAUNCHER_RANK_START is refused here, before the launch."""
    from launcher.runners.rank_fork import rank_start

    rank_start()
    extra = {**thread_environment(cfg), "PYTHONUNBUFFERED": "1"}
    if cfg.restarts > 0:
        # torchrun's shared rendezvous store keeps the killed ranks' addresses, and restarted
        # ranks would dial them (pytorch/pytorch#135712): give every attempt a fresh store.
        extra["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return {key: value for key, value in extra.items() if key not in os.environ}


class TorchrunRunner(LocalRunner):
    name = "torchrun"

    def command(self, cfg: RootConfig, run_dir: Path) -> list[str]:
        return torchrun_argv(cfg, run_dir, self.worker)

    def environment(self, cfg: RootConfig) -> dict[str, str]:
        return environment_additions(cfg)

    def run(self, cfg: RootConfig, run_dir: Path, plan: Plan) -> int:
        if cfg.parallel.nodes == 1:  # the ranks read config.yaml
            return run_torchrun(run_dir, plan.command, plan.env)
        from launcher.runners.local_nodes import other_nodes

        with other_nodes(cfg, plan.command[1:], plan.env):
            return run_torchrun(run_dir, plan.command, plan.env)


@contextmanager
def _environment(additions: dict[str, str]) -> Iterator[None]:
    """The planned additions in this process's environment (the agent copies it for the ranks)
    while the agent runs; a sweep's next point plans against the environment it started with."""
    added = {key: value for key, value in additions.items() if key not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def run_torchrun(
    run_dir: Path,
    argv: list[str],
    env: dict[str, str],
    *,
    first_node: bool = True,
    scratch: Path | None = None,
) -> int:
    """Run the planned torchrun command, in this process, with the planned environment additions.

    Exit status: 0, STOPPED_RESUMABLE after a graceful stop, 143 after a second SIGTERM, HUNG when
    the hang watchdog ended the ranks and no restart was left, COMPLETE_HELD when it ended a rank
    that held a run whose work was complete and saved, the status of the rank that failed
    first (named), or 1 when a signal ended it. A second Ctrl-C raises
    KeyboardInterrupt. first_node=False (cluster=torchrun's other nodes): the last attempt's marks
    in the shared run directory are node 0's to clear; `scratch`: this node's torchrun scratch.
    """
    from launcher.runners.agent import blame, run_agent, write_failures
    from launcher.runners.held import (
        MISSING,
        died_after_work,
        died_exit_line,
        ended_after_training,
        hang_exit_line,
        held_exit_line,
        rerun,
        write_held_summary,
    )
    from launcher.runners.signals import StopAtOnce, forward_stop_signals
    from launcher.runners.slurm_node import resumable
    from launcher.runners.watchdog import Watchdog
    from launcher.tracking.run_end import peer_named_hang, write_hung_summary

    assert argv[0] == TORCHRUN, argv
    if first_node:
        clear_rank_errors(run_dir)
        clear_stopped(run_dir)
        rank_failures_file(run_dir).unlink(missing_ok=True)
    failures = []
    try:
        with _environment(env), forward_stop_signals(run_dir), Watchdog(run_dir) as watchdog:
            failures = run_agent(argv[1:])
    except StopAtOnce as stop:
        if stop.work is not None:  # training was over: nothing to stop after, nothing to save
            return ended_after_training(stop.work, run_dir)
        if read_stopped(run_dir) is not None:
            return STOPPED_RESUMABLE  # the ranks had saved and were exiting
        log.warning(f"stopped at once (a second SIGTERM); {rerun(run_dir)}.")
        return 128 + signal.SIGTERM
    finally:
        shutil.rmtree(scratch or run_dir / AGENT_DIR, ignore_errors=True)
        with suppress(OSError):
            (run_dir / AGENT_DIR).rmdir()  # cluster=torchrun: the last node to end
    if read_stopped(run_dir) is not None or resumable(f.exitcode for f in failures):
        return STOPPED_RESUMABLE  # stopped on a signal after a checkpoint (rank 0 said where)
    if watchdog.held_complete is not None:
        summary = write_held_summary(run_dir, watchdog.held_complete, COMPLETE_HELD)
        log.error(held_exit_line(watchdog.held_complete, COMPLETE_HELD, summary))
        return COMPLETE_HELD
    hangs = watchdog.hangs
    if failures and not hangs:  # another node's watchdog may have killed the rank they waited on
        hangs = peer_named_hang(run_dir, min(f.timestamp for f in failures))
    if failures and hangs:
        write_failures(rank_failures_file(run_dir), failures)
        log.error(hang_exit_line(hangs, HUNG, run_dir))
        write_hung_summary(run_dir, hangs[-1], HUNG)
        return HUNG
    if failures and (died := died_after_work(run_dir, failures)) is not None:
        write_failures(rank_failures_file(run_dir), failures)
        summary = write_held_summary(run_dir, died, COMPLETE_HELD, key="died_after_work")
        log.error(died_exit_line(died, COMPLETE_HELD) + ("" if summary else f" ({MISSING})"))
        return COMPLETE_HELD
    if failures:
        write_failures(rank_failures_file(run_dir), failures)
        log.error(blame(failures, run_dir))
        first = failures[0].exitcode  # a rank's own status (DIVERGED, ...) is the job's
        return first if first > 0 else FAILED
    return 0
