"""Two or more "nodes" on this machine for cluster=torchrun's tests: each node's `launch train` a
background process with its output in <run dir>-<name>.log; none outlives its test."""

from __future__ import annotations

from pathlib import Path

import psutil

from tests.e2e.test_resume import ENV
from tests.helpers import BackgroundLaunch

NODE_WAIT_S = 240
STARTED: list[BackgroundLaunch] = []


def start_node(
    args: list[str],
    run_dir: Path,
    name: str,
    env: dict[str, str] | None = None,
    *,
    own_session: bool = False,
) -> BackgroundLaunch:
    """One node's `launch train`, with the environment an engine would give its pod (`env`);
    own_session: in a process group of its own, so that the node's whole `launch` (agent and
    ranks) can be killed at once."""
    log = run_dir.parent / f"{run_dir.name}-{name}.log"
    extra = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", **ENV, **(env or {})}
    node = BackgroundLaunch(args, run_dir, log, extra, own_session=own_session)
    STARTED.append(node)
    return node


def end_started_nodes() -> None:
    """A failed test leaves no node waiting at a rendezvous, nor a rank (a stopped one too)."""
    while STARTED:
        node = STARTED.pop()
        if node.proc.poll() is None:
            for proc in psutil.Process(node.proc.pid).children(recursive=True):
                proc.kill()
            node.proc.kill()
            node.wait(NODE_WAIT_S)
