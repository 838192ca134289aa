"""cluster=torchrun as on SLURM (issue 46), two "nodes" on this machine: an elastic job
(parallel.min_nodes=1 of 2, torchrun's --nnodes=1:2) loses a node (its `launch` process group
SIGKILLed mid-run) and goes on with the other, on the split derived for one rank, with the losses
of one process; and a rank stopped with SIGSTOP on one node ends the job on both, named."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from launcher.events import read_events
from launcher.exit_codes import HUNG
from launcher.runners.meeting import free_port
from tests.e2e.nodes import NODE_WAIT_S, end_started_nodes, start_node
from tests.e2e.test_elastic import ELASTIC, assert_restarted_on_one_node, one_process
from tests.e2e.test_resume import COMMON, DP2, SLOW, last_per_step
from tests.helpers import (
    FAST,
    BackgroundLaunch,
    max_rel_diff,
    rank_number,
    read_losses,
    read_summary,
)

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]


@pytest.fixture(autouse=True)
def no_node_left() -> Iterator[None]:
    yield
    end_started_nodes()


def two_nodes(args: list[str], run_dir: Path) -> list[BackgroundLaunch]:
    """Nodes 0 and 1, each in a process group of its own (killed whole)."""
    return [
        start_node([*args, f"cluster.node_rank={i}"], run_dir, f"n{i}", own_session=True)
        for i in range(2)
    ]


def on_two_nodes(port: int) -> list[str]:
    return [
        "cluster=torchrun",
        f"cluster.rdzv_endpoint=127.0.0.1:{port}",
        "cluster.rdzv_timeout=60",
    ]


def test_an_elastic_job_goes_on_without_a_killed_node_with_one_process_losses(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    reference = one_process(tmp_path_factory)
    run_dir, port = tmp_path / "run", free_port()
    args = [
        *COMMON,
        *ELASTIC,
        SLOW,
        *on_two_nodes(port),
        "cluster.rdzv_last_call=8",  # both start side by side: the first round has both
        "cluster.rdzv_keep_alive=1",  # the killed node is gone after 3 s
    ]
    nodes = two_nodes(args, run_dir)
    nodes[0].wait_for_step(5, NODE_WAIT_S)
    os.killpg(nodes[1].proc.pid, signal.SIGKILL)  # node 1's agent and its rank
    assert nodes[0].wait(NODE_WAIT_S) == 0, nodes[0].output + nodes[1].output
    output = nodes[0].output

    # started on both nodes; one restart, on node 0 alone
    assert [e["event"] for e in read_events(run_dir)] == ["restart"]
    assert_restarted_on_one_node(run_dir, output)
    assert max_rel_diff(last_per_step(run_dir), read_losses(reference)) < 1e-5


HANG_TIMEOUT = 4


def rank_on_nodes(nodes: list[BackgroundLaunch], rank: int) -> tuple[int, psutil.Process]:
    """The node running global rank `rank` (the rendezvous numbers nodes by host and pid, not
    node rank), and that rank's process."""
    for i, node in enumerate(nodes):
        for proc in psutil.Process(node.proc.pid).children(recursive=True):
            if rank_number(proc) == rank:
                return i, proc
    raise AssertionError(f"no rank {rank} on either node")


def test_a_stopped_rank_ends_both_nodes_and_is_named(tmp_path: Path) -> None:
    run_dir, port = tmp_path / "run", free_port()
    args = [
        "train",
        "train.steps=200",
        "batch.global_size=8",
        *FAST,
        *DP2,
        "parallel.nodes=2",
        "debug.step_sleep_s=0.2",
        f"train.hang_timeout={HANG_TIMEOUT}",
        *on_two_nodes(port),
    ]
    nodes = two_nodes(args, run_dir)
    nodes[0].wait_for_step(4, NODE_WAIT_S)
    holder, stopped = rank_on_nodes(nodes, 1)
    stopped.suspend()  # SIGSTOP: it cannot answer, not even with its own stack
    codes = [node.wait(120) for node in nodes]  # far less than the process group's 600 s
    outputs = [node.output for node in nodes]
    assert codes[holder] == HUNG, "\n".join(outputs)
    assert "hang: rank 1 on " in outputs[holder] and "(stopped)" in outputs[holder]
    # the other node's rank only waited in a collective: that node ends too, naming rank 1 from
    # the holder's record in the shared run directory
    other = 1 - holder
    assert codes[other] == HUNG, outputs[other]
    last = outputs[other].strip().splitlines()[-1]
    assert "the job hung (rank 1 on " in last and "named by its node" in last, outputs[other]

    named = [e for e in read_events(run_dir) if e["event"] == "hang" and e["ranks"]]
    assert [e["ranks"] for e in named] == [[1]] and named[0]["stopped"] == [1], named
    summary = read_summary(run_dir)
    assert summary["status"] == "hung" and summary["hang"]["ranks"] == [1], summary
