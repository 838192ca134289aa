"""`launch verify cluster=torchrun` (issue 46): every node runs the same `launch verify`; the
configured split runs on both "nodes" (one rank each) through the job's rendezvous, then node 0
runs the one-process reference and writes the certificate; the other node exits 0 after the
split, writing nothing of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.runners.meeting import free_port
from tests.e2e.test_verify import GPT
from tests.helpers import BackgroundLaunch

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]


def test_two_nodes_certify_their_split_and_node_0_writes_the_certificate(tmp_path: Path) -> None:
    run_dir, port = tmp_path / "run", free_port()
    args = [
        "verify",
        *GPT,
        "parallel.dp=2",
        "parallel.nodes=2",
        "verify.steps=2",
        "cluster=torchrun",
        f"cluster.rdzv_endpoint=127.0.0.1:{port}",
        "cluster.rdzv_timeout=60",
    ]
    nodes = [
        BackgroundLaunch([*args, f"cluster.node_rank={i}"], run_dir, tmp_path / f"n{i}.log", {})
        for i in range(2)
    ]
    try:
        codes = [node.wait(240) for node in nodes]
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.proc.kill()
                node.wait(60)
    outputs = [node.output for node in nodes]
    assert codes == [0, 0], "\n".join(outputs)
    assert "certified: this split trains the same model" in outputs[0]
    assert "node 0 certifies it" in outputs[1] and "certified:" not in outputs[1]
    certificate = json.loads((run_dir / "verify.json").read_text())
    assert certificate["certified"] and certificate["split"]["dp"] == 2, certificate
    assert certificate["reference"]["dp"] == 1
    split = run_dir / "verify" / "split"
    plan = json.loads((split / "plan.json").read_text())
    assert "--nnodes=2" in plan["command"] and "launcher.verify.worker" in plan["command"]
    for where in (run_dir, split):  # the command every node runs: the user's directory
        command = (where / "nodes.txt").read_text().splitlines()[2]
        assert command.startswith("launch verify "), command
        assert command.endswith(f"hydra.run.dir={run_dir.resolve()}"), command
