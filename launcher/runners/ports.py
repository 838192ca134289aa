"""A free rendezvous port per SLURM job: `python -m launcher.runners.ports JOB_ID` prints it.

train.sbatch runs this on the job's first node (the batch script's host, where the c10d store
listens) unless cluster.port names one. The search starts at 29500 + job id % 1000, so that jobs
sharing a node start apart, and takes the first port there, going up (within those 1000), that
is free now together with the next one (`launch verify`'s step in the job listens there): a
port the previous job on the node still holds, or another job's whose id is 1000 apart, is
passed over. Ranks on one node (cluster=local) need none of this: torchrun's --standalone and the
elastic agents bind a port the kernel gives them free (launcher/runners/torchrun.py).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable

BASE = 29500
SPAN = 1000
TOGETHER = 2
"""The rendezvous port and the next one (verify's step, launcher/runners/slurm_verify.py)."""


def is_free(port: int) -> bool:
    """Whether a server could listen on `port` on every interface now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def job_port(
    job_id: int, base: int = BASE, span: int = SPAN, free: Callable[[int], bool] = is_free
) -> int:
    """The job's port: the first from base + job id % span (wrapping within the span) that is
    free with the next TOGETHER - 1 ones; the first one when none is (the rendezvous then says
    which port it could not take)."""
    first = job_id % span
    for offset in range(span):
        port = base + (first + offset) % span
        if all(free(port + i) for i in range(TOGETHER)):
            return port
    return base + first


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    job_id = int(args[0]) if args and args[0].isdigit() else 0
    print(job_port(job_id))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
