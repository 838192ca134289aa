"""cluster=torchrun (issue 46): two "nodes" on this machine, each a `launch train` with one rank,
meet at a c10d rendezvous and train one run into one shared run directory; the losses are one
process's. The values may come from Kubeflow Trainer's PET_* environment alone; a stop signal and
the same commands again resume exactly; a node that does not see the run directory stops with the
shared-filesystem error; and with cluster=local, PET_* variables never make a run wait."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from launcher.exit_codes import STOPPED_RESUMABLE
from launcher.rundir import SAVE_PAUSED_FILE
from launcher.runners.meeting import SHARED_FIX, free_port
from launcher.runners.seats import seat_key
from tests.e2e.nodes import NODE_WAIT_S, end_started_nodes, start_node
from tests.e2e.test_elastic import one_process
from tests.e2e.test_resume import COMMON, DP1, DP2, ENV, SLOW, last_per_step
from tests.helpers import BackgroundLaunch, max_rel_diff, read_losses, read_metrics, run_launch

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]


@pytest.fixture(autouse=True)
def no_node_left() -> Iterator[None]:
    yield
    end_started_nodes()


def nodes_args(port: int) -> list[str]:
    return [
        *COMMON,
        *DP2,
        "parallel.nodes=2",
        "cluster=torchrun",
        f"cluster.rdzv_endpoint=127.0.0.1:{port}",
    ]


def pet_env(port: int, rank: int) -> dict[str, str]:
    """What Kubeflow Trainer's torch runtime sets in each pod."""
    return {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
    }


def both_finish(nodes: list[BackgroundLaunch]) -> list[int]:
    return [node.wait(NODE_WAIT_S) for node in nodes]


def three_nodes(port: int) -> list[str]:
    """Three one-rank nodes meeting at 127.0.0.1:port."""
    return [
        "parallel.dp=3",
        "batch.global_size=12",
        "batch.micro_size=4",
        "parallel.nodes=3",
        "cluster=torchrun",
        f"cluster.rdzv_endpoint=127.0.0.1:{port}",
        # a node's start-up took over 60 s on a loaded 2-core CI machine: the first node's
        # meeting ended before the last came
        "cluster.rdzv_timeout=180",
    ]


def test_pet_variables_do_not_make_a_local_run_wait(tmp_path: Path) -> None:
    """torchrun reads PET_NNODES=2 as --nnodes=2 unless told otherwise: the run would wait for a
    second node for ever. It trains here, and the warning names the variables and the fix."""
    port = free_port()
    proc = run_launch(
        [*COMMON, *DP2, "train.steps=2"],
        tmp_path / "run",
        env={**ENV, **pet_env(port, 0), "PET_NPROC_PER_NODE": "2"},
        timeout=NODE_WAIT_S,  # a subprocess with a deadline: a wait ends as a failure
    )
    assert len(read_losses(tmp_path / "run")) == 2
    for name in ("PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK"):
        assert name in proc.stderr + proc.stdout
    assert "Fix: to train with the other nodes, run the same command on each with " in (
        proc.stderr + proc.stdout
    )
    assert "cluster=torchrun parallel.nodes=2" in proc.stderr + proc.stdout


def test_two_nodes_from_pet_variables_train_one_run_with_one_process_losses(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """Only what Kubeflow Trainer sets; node 1 starts first and is still not node 0. (The same
    job from cluster.* keys: the SIGTERM test below, which resumes it to the same losses.)"""
    reference = one_process(tmp_path_factory)
    run_dir, port = tmp_path / "run", free_port()
    args = [*COMMON, *DP2, "cluster=torchrun"]
    nodes = [
        start_node(args, run_dir, f"n{i}", env)
        for i, env in enumerate([pet_env(port, 1), pet_env(port, 0)])
    ]
    codes = both_finish(nodes)
    assert codes == [0, 0], "\n".join(n.output for n in nodes)
    assert sum(": done" in n.output for n in nodes) == 1  # the node that is not node 0
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, 13))  # written once, by one rank
    assert max_rel_diff(read_losses(run_dir), read_losses(reference)) < 1e-5
    text = (run_dir / "nodes.txt").read_text()
    assert f"hydra.run.dir={run_dir.resolve()}" in text
    assert "PET_NNODES=2" in text and "PET_MASTER_ADDR, PET_MASTER_PORT" in text
    assert "PET_NODE_RANK=0" in text  # node 0 wrote it
    assert "cluster.node_rank" not in text.splitlines()[2]  # not in the shared command


def test_sigterm_to_both_nodes_then_the_same_commands_resume_exactly(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    reference = one_process(tmp_path_factory)
    run_dir, port = tmp_path / "run", free_port()
    args = [*nodes_args(port), SLOW]
    nodes = [start_node(args, run_dir, f"n{i}", {}) for i in range(2)]
    nodes[0].wait_for_step(5, NODE_WAIT_S)
    for node in nodes:
        node.proc.send_signal(signal.SIGTERM)
    codes = both_finish(nodes)
    assert codes == [STOPPED_RESUMABLE] * 2, "\n".join(n.output for n in nodes)
    stopped_at = len(read_losses(run_dir))
    assert 5 <= stopped_at < 12
    follower = next(n for n in nodes if "is_host=false" in n.output)  # not node 0
    assert "on every node to resume (exit status 75)" in follower.output.splitlines()[-1]

    again = [start_node(args, run_dir, f"r{i}", {}) for i in range(2)]
    assert both_finish(again) == [0, 0], "\n".join(n.output for n in again)
    assert sum(": done" in n.output for n in again) == 1  # the node that is not node 0
    assert max_rel_diff(last_per_step(run_dir), read_losses(reference)) < 1e-5
    text = (run_dir / "nodes.txt").read_text()  # the command each node runs, from the keys
    assert f"hydra.run.dir={run_dir.resolve()}" in text
    assert "cluster.rdzv_endpoint" in text and f"127.0.0.1:{port}" in text


def test_a_node_that_does_not_see_the_run_directory_stops(tmp_path: Path) -> None:
    """Two machines whose hydra.run.dir is not shared: the same path, different filesystems."""
    port = free_port()
    dirs = [tmp_path / "machine_a" / "run", tmp_path / "machine_b" / "run"]
    nodes = [
        start_node([*nodes_args(port), "train.steps=2"], d, f"n{i}", {}) for i, d in enumerate(dirs)
    ]
    codes = both_finish(nodes)
    blind = [n for n in nodes if "this node does not see the run directory" in n.output]
    assert len(blind) == 2  # one stops with the error, the other names it
    assert sorted(codes) == [1, 2], "\n".join(n.output for n in nodes)
    for node in nodes:
        assert SHARED_FIX in node.output
    assert not any((d / "metrics.jsonl").exists() for d in dirs)


def test_the_jobs_directory_lets_its_nodes_in_and_keeps_other_runs_out(tmp_path: Path) -> None:
    """While a two-node job runs (held in its step-2 save), a run of its own into the directory
    is refused by node 0's lock, and a third node of the job by the rendezvous."""
    run_dir, port = tmp_path / "run", free_port()
    args = [*nodes_args(port), "checkpoint.every=2", "debug.pause_save_at_step=2"]
    nodes = [start_node(args, run_dir, f"n{i}", {}) for i in range(2)]
    try:
        deadline = time.monotonic() + NODE_WAIT_S
        while not (run_dir / SAVE_PAUSED_FILE).exists():
            assert time.monotonic() < deadline, "\n".join(n.output for n in nodes)
            assert all(n.proc.poll() is None for n in nodes), "\n".join(n.output for n in nodes)
            time.sleep(0.1)
        third = run_launch([*COMMON, *DP1], run_dir, env=ENV, check=False)
        assert third.returncode == 2, third.stdout + third.stderr
        assert "is in use by a run that is still going" in third.stderr
        assert f"node 0 of the cluster=torchrun job run at 127.0.0.1:{port}" in third.stderr
        extra = start_node(args, run_dir, "n2", {})
        assert extra.wait(NODE_WAIT_S) == 2, extra.output
        assert "already has its 2 nodes" in extra.output
        assert all(n.proc.poll() is None for n in nodes)  # the job goes on
    finally:
        for node in nodes:
            node.proc.kill()
            node.wait(NODE_WAIT_S)


def test_a_rendezvous_that_does_not_complete_names_who_came(tmp_path: Path) -> None:
    port = free_port()
    proc = run_launch(
        [*COMMON, *DP2, "cluster=torchrun", "cluster.rdzv_timeout=3"],
        tmp_path / "run",
        env={**ENV, **pet_env(port, 0)},
        timeout=NODE_WAIT_S,  # a subprocess with a deadline: a wait ends as a failure
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "did not complete" in ln]
    assert f"the rendezvous at 127.0.0.1:{port} (run) did not complete in 3 s" in line
    assert "1 of 2 node(s) came: node 0 " in line and "missing: node 1." in line
    assert "((" not in line and "))" not in line
    assert "Fix: start the same command on the missing node(s)" in line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def seats_taken(port: int) -> int:
    """How many nodes sit at the meeting on node 0's store (the test's own client)."""
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=20))
    return sum(bool(store.check([seat_key(i)])) for i in range(1, 4))


def wait_for_seats(port: int, count: int, nodes: list[BackgroundLaunch]) -> None:
    deadline = time.monotonic() + NODE_WAIT_S
    while True:
        try:
            if seats_taken(port) >= count:
                return
        except RuntimeError:
            pass  # node 0's store is not up yet
        assert time.monotonic() < deadline, "\n".join(n.output for n in nodes)
        assert all(n.proc.poll() is None for n in nodes), "\n".join(n.output for n in nodes)
        time.sleep(0.2)


def test_a_node_killed_mid_run_and_started_again_rejoins_the_job(tmp_path: Path) -> None:
    """kill -9 of node 1 while training; the same command again takes its seat (its old holder
    is gone), node 0's agent restarts the ranks with it, and the run completes."""
    run_dir, port = tmp_path / "run", free_port()
    args = [*nodes_args(port), SLOW, "train.max_restarts=2", "cluster.rdzv_timeout=60"]
    nodes = [start_node([*args, f"cluster.node_rank={i}"], run_dir, f"n{i}", {}) for i in range(2)]
    nodes[0].wait_for_step(3, NODE_WAIT_S)
    nodes[1].proc.kill()
    nodes[1].wait(NODE_WAIT_S)
    again = start_node([*args, "cluster.node_rank=1"], run_dir, "n1b", {})
    codes = both_finish([nodes[0], again])
    assert codes == [0, 0], nodes[0].output + again.output
    assert "already has its 2 nodes" not in again.output
    assert last_per_step(run_dir)  # the run went on to its end
    assert read_metrics(run_dir)[-1]["step"] == 12


def test_node_0_gone_while_a_node_waits_in_the_meeting_is_one_error(tmp_path: Path) -> None:
    run_dir, port = tmp_path / "run", free_port()
    args = [*COMMON, *three_nodes(port)]
    nodes = [start_node([*args, f"cluster.node_rank={i}"], run_dir, f"n{i}", {}) for i in (0, 1)]
    wait_for_seats(port, 2, nodes)
    nodes[0].proc.kill()
    assert nodes[1].wait(NODE_WAIT_S) == 1, nodes[1].output
    assert f"node 0 at 127.0.0.1:{port} went away before every node arrived" in nodes[1].output
    assert "Traceback" not in nodes[1].output


@pytest.mark.parametrize("restarts", [0, 1])
def test_node_0_killed_mid_training_is_one_error_on_the_others(
    restarts: int, tmp_path: Path
) -> None:
    """Without restarts the ranks fail first (a peer's connection closed); with them torchrun's
    rendezvous fails: either way the last line says node 0 is gone."""
    run_dir, port = tmp_path / "run", free_port()
    args = [*nodes_args(port), SLOW, f"train.max_restarts={restarts}", "cluster.rdzv_timeout=20"]
    nodes = [start_node([*args, f"cluster.node_rank={i}"], run_dir, f"n{i}", {}) for i in range(2)]
    nodes[0].wait_for_step(3, NODE_WAIT_S)
    nodes[0].proc.kill()
    assert nodes[1].wait(NODE_WAIT_S) == 1, nodes[1].output
    assert "Traceback" not in nodes[1].output, nodes[1].output
    gone = f"error: node 0 (the rendezvous host at 127.0.0.1:{port}) is gone"
    assert nodes[1].output.strip().splitlines()[-1].startswith(gone), nodes[1].output
    assert "has failed to shutdown the rendezvous" not in nodes[1].output  # said once, ours
    assert "start the same command on every node again" in nodes[1].output


def test_another_job_at_the_same_endpoint_is_refused_and_leaves_the_job_alone(
    tmp_path: Path,
) -> None:
    port = free_port()
    args = [*nodes_args(port), "train.steps=2", "cluster.rdzv_timeout=60"]
    first = start_node(args, tmp_path / "j1", "n0", {})
    wait_for_seats(port, 1, [first])
    other = start_node(args, tmp_path / "j2", "n0", {})
    assert other.wait(NODE_WAIT_S) == 2, other.output
    assert f"the endpoint 127.0.0.1:{port} is taken by another job, 'j1'" in other.output
    assert "cluster.rdzv_endpoint=127.0.0.1:" in other.output
    assert first.proc.poll() is None, first.output  # not told to stop
    second = start_node(args, tmp_path / "j1", "n1", {})
    assert both_finish([first, second]) == [0, 0], first.output + second.output


def test_a_node_with_another_config_is_refused(tmp_path: Path) -> None:
    run_dir, port = tmp_path / "run", free_port()
    args = [*nodes_args(port), "cluster.rdzv_timeout=60"]
    first = start_node([*args, "train.steps=2", "cluster.node_rank=0"], run_dir, "n0", {})
    wait_for_seats(port, 1, [first])
    other = start_node([*args, "train.steps=3", "cluster.node_rank=1"], run_dir, "n1", {})
    codes = both_finish([first, other])
    assert codes == [1, 2], first.output + other.output
    assert "this node's config differs from node 0's" in other.output
    assert "train.steps=3 (node 0: 2)" in other.output
    assert "Fix: run the same command on every node" in other.output
    assert "node 1" in first.output and "config differs" in first.output
    assert not (run_dir / "metrics.jsonl").exists()


def test_sigterm_to_a_node_in_the_meeting_is_one_line_and_frees_its_seat(tmp_path: Path) -> None:
    run_dir, port = tmp_path / "run", free_port()
    args = [*nodes_args(port), "train.steps=2", "cluster.rdzv_timeout=60"]
    first = start_node(args, run_dir, "n0", {})
    wait_for_seats(port, 1, [first])
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(NODE_WAIT_S) == 128 + signal.SIGTERM, first.output
    assert "stopped (SIGTERM) while waiting for the other nodes" in first.output
    assert "Fix: start the same command on every node again (this node held" in first.output


def test_node_0_on_a_machine_that_is_not_the_endpoints_host_is_told_so(tmp_path: Path) -> None:
    with socket.socket() as held:  # the port is taken here, so node 0 cannot listen on it
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = run_launch(
            [
                *COMMON,
                *DP2,
                "parallel.nodes=2",
                "cluster=torchrun",
                "cluster.node_rank=0",
                f"cluster.rdzv_endpoint=192.0.2.1:{port}",
                "cluster.rdzv_timeout=5",
            ],
            tmp_path / "run",
            env=ENV,
            timeout=NODE_WAIT_S,
            check=False,
        )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "but this machine is not 192.0.2.1" in proc.stderr
    assert "PET_NODE_RANK" in proc.stderr and "choose a free port" not in proc.stderr


def test_a_node_stopped_in_the_meeting_and_started_again_leaves_room_for_the_last(
    tmp_path: Path,
) -> None:
    """Three nodes: A and B wait, B is stopped (Ctrl-C) and started again, then C comes: all
    three train (B's first seat was given back)."""
    run_dir, port = tmp_path / "run", free_port()
    args = [*COMMON, "train.steps=2", *three_nodes(port)]
    a = start_node(args, run_dir, "a", {})
    wait_for_seats(port, 1, [a])
    b = start_node(args, run_dir, "b", {})
    wait_for_seats(port, 2, [a, b])
    b.proc.send_signal(signal.SIGINT)
    b.wait(NODE_WAIT_S)
    nodes = [a, start_node(args, run_dir, "b2", {}), start_node(args, run_dir, "c", {})]
    assert both_finish(nodes) == [0, 0, 0], "\n".join(n.output for n in nodes)
    assert read_metrics(run_dir)[-1]["step"] == 2


def test_a_node_that_leaves_and_does_not_come_back_ends_node_0_with_one_line(
    tmp_path: Path,
) -> None:
    run_dir, port = tmp_path / "run", free_port()
    args = [*nodes_args(port), SLOW, "train.max_restarts=1", "cluster.rdzv_timeout=10"]
    nodes = [start_node([*args, f"cluster.node_rank={i}"], run_dir, f"n{i}", {}) for i in range(2)]
    nodes[0].wait_for_step(3, NODE_WAIT_S)
    nodes[1].proc.kill()
    assert nodes[0].wait(NODE_WAIT_S) == 1, nodes[0].output
    assert "Traceback" not in nodes[0].output, nodes[0].output
    last = nodes[0].output.strip().splitlines()[-1]
    assert "left and did not come back within 10 s" in last, nodes[0].output
    assert "start the same command on every node again" in last
