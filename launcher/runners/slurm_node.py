"""What each node's srun task runs: torchrun (same arguments), adapted to SLURM's signals.

`python -m launcher.runners.slurm_node <torchrun arguments>` differs from torchrun in two ways:

- A signal to a SLURM step reaches every process of the step, the ranks included. So torchrun's
  agent ignores SIGUSR1 and SIGTERM instead of dying of USR1 or forwarding a second TERM (which a
  rank takes as "stop at once"); it keeps watching the ranks while they save a checkpoint.
- torchrun exits 1 whenever a rank fails. When the ranks stopped with STOPPED_RESUMABLE (saved a
  checkpoint on a stop signal), this exits with that status, so that the batch script can tell a
  preemption (requeue) from a failure (no requeue).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
from collections.abc import Iterable
from types import FrameType

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig
from torch.distributed.run import parse_args, run

from launcher.exit_codes import STOPPED_RESUMABLE

AGENT_IGNORES = (signal.SIGUSR1, signal.SIGTERM)
AGENT_HANDLES = "SIGINT,SIGHUP,SIGQUIT"  # torchrun's default set, less SIGTERM


def resumable(exit_codes: Iterable[int]) -> bool:
    """True when a rank stopped resumably and no rank failed for another reason.

    A rank exits STOPPED_RESUMABLE only after every rank has committed the checkpoint together, so
    one such exit means the run can resume. Once one rank has ended, torchrun ends the others
    (SIGTERM, then SIGKILL); those exits are its cleanup, not failures of their own.
    """
    codes = list(exit_codes)
    cleanup = {-signal.SIGTERM, -signal.SIGKILL}
    return STOPPED_RESUMABLE in codes and all(c == STOPPED_RESUMABLE or c in cleanup for c in codes)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A handler, not SIG_IGN: handlers are reset in the ranks at exec, SIG_IGN would be inherited."""


def torchrun_args(argv: list[str]) -> list[str]:
    """torchrun's arguments, telling it to leave SIGTERM alone where this torch can be told."""
    known = {f.name for f in dataclasses.fields(LaunchConfig)}
    return [f"--signals_to_handle={AGENT_HANDLES}", *argv] if "signals_to_handle" in known else argv


@record
def main(argv: list[str] | None = None) -> int:
    for sig in AGENT_IGNORES:
        signal.signal(sig, _ignore)
    args = parse_args(torchrun_args(sys.argv[1:] if argv is None else argv))
    try:
        run(args)
    except ChildFailedError as exc:
        codes = [failure.exitcode for failure in exc.failures.values()]
        if not resumable(codes):
            raise
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        print(
            f"launcher: {node}: {len(codes)} rank(s) stopped resumably (exit {STOPPED_RESUMABLE})."
        )
        return STOPPED_RESUMABLE
    return 0


if __name__ == "__main__":
    sys.exit(main())
