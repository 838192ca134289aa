"""An elastic job loses a node on the real cluster: SLURM removes it from the job, train.sbatch
runs the step again on the node left, the ranks derive the split (dp 2 -> 1, more accumulation)
and resume from the newest checkpoint; preempted then, the job is requeued onto the one node left
(not held for the two it started on), and the run ends on the uninterrupted trajectory."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import LAUNCH, REPO, max_rel_diff, read_metrics, read_summary
from tests.slurm.conftest import JOB, STEPS, TRAIN_AND_WAIT, job_log, steps_logged, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.takes_node_down]


def job_nodes(job: str) -> list[str]:
    listed = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not listed:
        return []
    names = subprocess.run(
        ["scontrol", "show", "hostnames", listed], capture_output=True, text=True, check=True
    )
    return names.stdout.split()


def node_state(node: str) -> str:
    return subprocess.run(
        ["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()


def take_down(node: str) -> None:
    """What a dead node looks like to the job. DOWN alone is undone within seconds here (the
    node's slurmd still answers, ReturnToService=2); DRAIN keeps it out of service."""
    for state in ("DOWN", "DRAIN"):
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", f"State={state}", "Reason=launcher-test"],
            check=True,
        )


def in_service(state: str) -> bool:
    """Not drained, down or unresponsive (`*`): idle, or already given to a waiting job (mixed,
    allocated, and `planned`, which backfill shows for a node kept for a pending job)."""
    return bool(state) and not state.endswith("*") and "drain" not in state and "down" not in state


def bring_back(node: str) -> None:
    subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
    states: list[str] = []

    def back() -> bool:
        states.append(node_state(node))
        return in_service(states[-1])

    try:
        wait_for(back, f"node {node} to be back in service", timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; sinfo said {sorted(set(states))}") from None


def test_a_lost_node_costs_a_restart_not_the_run(
    two_nodes: int, reference_losses: list[float], tmp_path: Path
) -> None:
    args = [
        *TRAIN_AND_WAIT,
        "cluster.max_requeues=1",
        "parallel.nodes=2",
        "parallel.min_nodes=1",
        "parallel.dp=2",
        "train.max_restarts=2",
        "checkpoint.every=4",
        "debug.step_sleep_s=0.3",  # time to take the node down mid-run
        *JOB,
        f"hydra.run.dir={tmp_path}",
    ]
    launch = subprocess.Popen(
        [*LAUNCH, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lost = job = None
    try:
        wait_for(lambda: any(tmp_path.glob("slurm-*.out")), "the job to start")
        job = next(tmp_path.glob("slurm-*.out")).stem.removeprefix("slurm-")
        wait_for(lambda: steps_logged(tmp_path) >= 5, f"step 5 of job {job}")
        nodes = job_nodes(job)
        assert len(nodes) == 2, f"the elastic job started on {nodes}, not on both idle nodes"
        lost = nodes[1]  # not the first node: it runs the batch script and the rendezvous
        take_down(lost)
        wait_for(lambda: "restarted on 1 node" in job_log(tmp_path, job), "the relaunch")
        relaunched_at = steps_logged(tmp_path)
        wait_for(lambda: steps_logged(tmp_path) >= relaunched_at + 3, "steps on one node")
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)  # preempted
        out, _ = launch.communicate(timeout=240)
    finally:
        if launch.poll() is None:
            launch.kill()
            if job is not None:
                subprocess.run(["scancel", job])  # not left holding a node for later tests
        if lost is not None:
            bring_back(lost)
    log = job_log(tmp_path, job)
    assert launch.returncode == 0, out + log
    assert f"lost node(s) {lost}; the step runs again on {nodes[0]}" in log, log
    # From step 4, or from step 8 when a busy machine let that save finish before the kill.
    assert re.search(r"restarted on 1 node \(dp 2 -> 1, grad_accum 2 -> 4\), from step [48]", log)
    assert f"requeued 1 time(s), on {nodes[0]};" in log, log  # the one node there is

    steps = [m["step"] for m in read_metrics(tmp_path)]
    assert steps == list(range(1, STEPS + 1)), steps  # the redone steps logged once
    losses = [m["loss"] for m in read_metrics(tmp_path)]
    assert max_rel_diff(losses, reference_losses) < 1e-5
    summary = read_summary(tmp_path)
    assert (summary["steps"], summary["world_size"], summary["grad_accum"]) == (STEPS, 1, 4)
    relaunch, requeue = [e for e in summary["events"] if e["event"] == "restart"]
    assert relaunch["nodes"] == 1 and relaunch["planned_nodes"] == 2, relaunch
    assert (relaunch["dp"], relaunch["grad_accum"]) == (1, 4) and relaunch["from_step"] in (4, 8)
    assert relaunch["lost_nodes"] == [lost], relaunch
    assert not relaunch["requeued"] and requeue["requeued"], requeue  # the job kept its nodes
    assert requeue["nodes"] == 1 and "lost_nodes" not in requeue, requeue
