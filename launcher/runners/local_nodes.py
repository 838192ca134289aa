"""An elastic job on this machine (cluster=local, parallel.min_nodes < parallel.nodes): one
torchrun agent per "node", all here, meeting at an elastic c10d rendezvous.

`launch` runs the first agent itself (it hosts the rendezvous store, as a SLURM job's first node
does) and starts the others as `python -m launcher.runners.local_nodes <torchrun arguments>`
(torchrun's agent, with the hang watchdog and the failure report of a SLURM node,
launcher/runners/slurm_node.py). A node that dies (its agent killed) ends its ranks; the others'
ranks fail in their next collective, their agents restart them (train.max_restarts), the
rendezvous closes with the nodes that are left (at least parallel.min_nodes), and the ranks derive
the split for that world and resume from the newest checkpoint (launcher/worker/elastic.py).

The rendezvous is tuned for one machine: a node whose agent stops reporting is dropped after
about 3 s (keep_alive_interval=1 x keep_alive_max_attempt=3) and the rendezvous closes 3 s after
the fewest nodes have joined (last_call_timeout=3). So that the first one has them all, `launch`
starts its own agent once the others have imported what they need to join (a byte each writes
to a pipe): they then reach its store within the agents' one-second retry.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from launcher.config.root import RootConfig
from launcher.lifetime import die_with_parent
from launcher.logs import get_logger
from launcher.rundir import AGENT_DIR

log = get_logger("nodes")

NODE_ENV = "LAUNCHER_LOCAL_NODE"
"""In each extra agent's environment: its node index (1, 2, ...)."""
RDZV_CONF = "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3"
READY_FD_ENV = "LAUNCHER_LOCAL_NODE_READY_FD"
"""The pipe an extra agent writes a byte to once it is ready to join, then closes (closed without
the byte: the agent is gone; `_wait_until_ready`)."""
READY_TIMEOUT_S = 30.0
"""Under the other agents' 60 s for reaching the first one's store (torch's read_timeout)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def elastic_args(cfg: RootConfig, port: int, run_id: str) -> list[str]:
    """torchrun's elastic membership: MIN:MAX nodes at a c10d rendezvous on this machine."""
    parallel = cfg.parallel
    return [
        f"--nnodes={parallel.least_nodes}:{parallel.nodes}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{port}",
        f"--rdzv_id={run_id}",
        f"--rdzv_conf=is_host=true,{RDZV_CONF}",
    ]


def other_node_args(argv: list[str], node: int) -> list[str]:
    """Node `node`'s torchrun arguments from the first node's: a client of its store, with a
    scratch directory of its own."""
    out = []
    for arg in argv:
        if arg.startswith("--rdzv_conf="):
            arg = arg.replace("is_host=true", "is_host=false")
        elif arg.startswith("--log-dir="):
            arg = f"{arg}-node{node}"
        out.append(arg)
    return out


@contextmanager
def other_nodes(
    cfg: RootConfig, argv: list[str], env: dict[str, str]
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The agents of nodes 1.. while the first node's agent runs here; they die with `launch`
    and are ended when it returns."""
    procs, ready = [], []
    for n in range(1, cfg.parallel.nodes):
        read_end, write_end = os.pipe()
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "launcher.runners.local_nodes", *other_node_args(argv, n)],
                env={**os.environ, **env, NODE_ENV: str(n), READY_FD_ENV: str(write_end)},
                pass_fds=(write_end,),
                # Before its imports (seconds, while `launch` waits for it): killed with `launch`.
                preexec_fn=die_with_parent,
            )
        )
        os.close(write_end)
        ready.append(read_end)
    try:
        gone = _wait_until_ready(ready)
        for n, proc in enumerate(procs, start=1):
            if gone[n - 1]:
                with suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)  # its pipe closed as it exited: reaped in a moment
                status = "unknown" if proc.returncode is None else proc.returncode
                log.warning(
                    f"node {n}'s agent exited (status {status}) before joining (its output is "
                    "above); the job starts without it."
                )
        yield procs
    finally:
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_until_ready(ready: list[int]) -> list[bool]:
    """Until every other agent has imported what it needs to join (each writes a byte to its
    pipe), or died (its pipe closed without one), or READY_TIMEOUT_S passed: the first
    rendezvous closes seconds after this node joins, and the others, new interpreters, take as
    long or longer to import torch. Then the job starts with all its nodes rather than growing
    by a restart once they come. Returns, for each pipe, whether its agent is gone."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    gone = [False] * len(ready)
    try:
        waiting = list(ready)
        while waiting and (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select(waiting, [], [], left)
            for fd in readable:
                gone[ready.index(fd)] = os.read(fd, 1) == b""
            waiting = [fd for fd in waiting if fd not in readable]
    finally:
        for fd in ready:
            os.close(fd)
    return gone


def _say_ready() -> None:
    """This agent is about to join the rendezvous: `launch` may start its own."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is not None and fd.isdigit():
        with suppress(OSError):
            os.write(int(fd), b"1")  # ready; a pipe closed without it is an agent gone
        with suppress(OSError):
            os.close(int(fd))


def main(argv: list[str] | None = None) -> int:
    """One extra node's agent (started by `launch`, dies with it)."""
    die_with_parent()
    import torch.distributed.run  # noqa: F401  (the agent's imports, before saying ready)

    from launcher.runners.agent import run_agent  # noqa: F401
    from launcher.runners.slurm_node import _run, run_dir_of

    _say_ready()

    args = sys.argv[1:] if argv is None else argv
    node = f"node{os.environ.get(NODE_ENV, '?')}"
    run_dir = run_dir_of(args)
    log_dir = next((a.split("=", 1)[1] for a in args if a.startswith("--log-dir=")), None)
    args = [a for a in args if not a.startswith("--log-dir=")]
    scratch = Path(log_dir) if log_dir else (run_dir / AGENT_DIR if run_dir else None)
    try:
        return _run(args, run_dir, node, scratch)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    from launcher.lifetime import exit_now

    exit_now(main())
