"""cluster=torchrun's refusals and `launch plan` (issue 46): each config error is one ConfigError
whose Fix works as printed; the plan prints the one command every node runs and where each
rendezvous value came from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launcher.config.rendezvous import ADDRESS_NAMES, NODE_RANK_ENV, NODES_ENV
from tests.e2e.test_fixes import applied, groups, refusal
from tests.helpers import run_launch

pytestmark = pytest.mark.e2e

NODES = ["parallel.nodes=2", "parallel.dp=2"]
ENDPOINT = "cluster.rdzv_endpoint=127.0.0.1:29500"
CASES = {
    "several_nodes_on_cluster_local": (NODES, "parallel.nodes, cluster"),
    "no_endpoint_anywhere": (["cluster=torchrun", *NODES], "cluster.rdzv_endpoint"),
    "node_rank_past_the_nodes": (
        ["cluster=torchrun", *NODES, ENDPOINT, "cluster.node_rank=2"],
        "cluster.node_rank",
    ),
    "one_node": (["cluster=torchrun", ENDPOINT], "parallel.nodes, cluster"),
    "verify_first": (
        ["cluster=torchrun", *NODES, ENDPOINT, "verify.first=true"],
        "verify.first, cluster",
    ),
}


@pytest.fixture(autouse=True)
def no_engine_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a bare machine: none of the variables an engine sets."""
    for name in (*ADDRESS_NAMES, *NODES_ENV, *NODE_RANK_ENV, "PET_NPROC_PER_NODE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("case", list(CASES))
def test_each_refusal_names_the_key_and_its_fixes_work(case: str, tmp_path: Path) -> None:
    args, keys = CASES[case]
    message = refusal(args, tmp_path / "refused")
    assert message.startswith(f"error: {keys}:"), message
    offered = groups(message)
    assert offered, message
    for i, overrides in enumerate(offered):
        run_launch(["plan", *applied(args, overrides)], tmp_path / f"fixed_{i}")


def test_plan_prints_the_command_every_node_runs_and_the_sources(tmp_path: Path) -> None:
    env = {
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "trainer-node-0-0.job",
        "PET_MASTER_PORT": "29400",
    }
    run_dir = tmp_path / "run"
    proc = run_launch(["plan", "cluster=torchrun", "parallel.dp=2"], run_dir, env=env)
    command = f"launch train cluster=torchrun parallel.dp=2 hydra.run.dir={run_dir.resolve()}"
    assert command in proc.stdout
    assert "--rdzv_endpoint=trainer-node-0-0.job:29400" in proc.stdout
    lines = (run_dir / "nodes.txt").read_text().splitlines()
    assert lines[2] == command
    sources = {line.split()[0]: line.split(None, 2)[2] for line in lines[4:]}
    assert sources == {
        "parallel.nodes": "PET_NNODES=2",
        "cluster.rdzv_endpoint": "PET_MASTER_ADDR, PET_MASTER_PORT",
        "cluster.rdzv_id": "the run directory's name",
        "cluster.node_rank": "PET_NODE_RANK=1",
    }


def test_an_elastic_job_asks_torchrun_for_a_range_of_nodes(tmp_path: Path) -> None:
    elastic = ["parallel.min_nodes=1", "train.max_restarts=2", "batch.micro_size=4"]
    args = ["plan", "cluster=torchrun", *NODES, ENDPOINT, *elastic]
    proc = run_launch(args, tmp_path / "run")
    assert "torchrun --nnodes=1:2 --nproc_per_node=1 --rdzv_backend=c10d" in proc.stdout
    assert "--rdzv_endpoint=127.0.0.1:29500 --rdzv_id=run" in proc.stdout


def test_a_nodes_own_rank_is_left_out_of_the_shared_command(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_launch(["plan", "cluster=torchrun", *NODES, ENDPOINT, "cluster.node_rank=1"], run_dir)
    lines = (run_dir / "nodes.txt").read_text().splitlines()
    shared = f"launch train cluster=torchrun {' '.join(NODES)} {ENDPOINT} hydra.run.dir="
    assert lines[2] == shared + str(run_dir.resolve())
    assert lines[-1].split()[:2] == ["cluster.node_rank", "1"]
    assert lines[-1].endswith("cluster.node_rank")


def test_the_cluster_local_warnings_fix_runs_as_printed(tmp_path: Path) -> None:
    """Kubeflow's PET_* variables under cluster=local: the warning's Fix (cluster=torchrun with
    the node count and the ranks in all) plans as printed."""
    env = {
        "PET_NNODES": "2",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "29400",
        "PET_NPROC_PER_NODE": "2",
    }
    args = ["plan", "parallel.dp=2", "batch.micro_size=2", "batch.global_size=8"]
    proc = run_launch(args, tmp_path / "local", env=env)
    text = proc.stdout + proc.stderr
    (fix,) = re.findall(r"run the same command on each with ([^(]+) \(docs", text)
    assert fix.split() == ["cluster=torchrun", "parallel.nodes=2", "parallel.dp=4"], text
    run_launch([*args, *fix.split()], tmp_path / "fixed", env=env)


def test_a_nodes_own_rank_with_plus_plus_is_left_out_too(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_launch(["plan", "cluster=torchrun", *NODES, ENDPOINT, "++cluster.node_rank=1"], run_dir)
    lines = (run_dir / "nodes.txt").read_text().splitlines()
    assert "node_rank" not in lines[2], lines[2]


def test_the_plans_command_quotes_a_run_directory_with_a_space(tmp_path: Path) -> None:
    run_dir = tmp_path / "sp ace"
    proc = run_launch(["plan", "cluster=torchrun", *NODES, ENDPOINT], run_dir)
    assert f"'--log-dir={run_dir}/.torchelastic/" in proc.stdout, proc.stdout


def test_pet_nnodes_min_max_is_an_elastic_job_of_min_to_max_nodes(tmp_path: Path) -> None:
    """PET_NNODES=1:2 (a PyTorchJob's elastic policy) is torchrun's 1 to 2 nodes: the plan asks
    torchrun for the range, with an elastic job's restarts, and says where it came from."""
    env = {"PET_NNODES": "1:2", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "29400"}
    args = ["plan", "cluster=torchrun", "parallel.dp=2", "batch.micro_size=4"]
    run_dir = tmp_path / "run"
    proc = run_launch(args, run_dir, env=env)
    assert "torchrun --nnodes=1:2 --nproc_per_node=1 --rdzv_backend=c10d" in proc.stdout
    assert "--max_restarts=3" in proc.stdout  # the elastic default, not a fixed job's 0
    lines = (run_dir / "nodes.txt").read_text().splitlines()
    sources = {line.split()[0]: line.split(None, 2)[1:] for line in lines[4:]}
    assert sources["parallel.nodes"] == ["2", "PET_NNODES=1:2"]
    assert sources["parallel.min_nodes"] == ["1", "PET_NNODES=1:2"]

    # a config that says otherwise is one error naming both; each of its fixes plans
    fixed = [*args[1:], "parallel.nodes=2", "parallel.min_nodes=2"]
    refused = run_launch(["plan", *fixed], tmp_path / "refused", env=env, check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = next(ln for ln in refused.stderr.splitlines() if "Fix:" in ln)
    assert message.startswith("error: parallel.min_nodes, PET_NNODES:"), message
    assert "parallel.min_nodes=2, but PET_NNODES=1:2" in message
    assert "start the nodes with PET_NNODES=2:2" in message
    (overrides,) = groups(message)
    run_launch(["plan", *applied(fixed, overrides)], tmp_path / "fixed", env=env)
    run_launch(["plan", *fixed], tmp_path / "env_fixed", env={**env, "PET_NNODES": "2:2"})


def test_a_bad_rank_start_is_refused_before_the_launch_and_its_printed_fix_works(
    tmp_path: Path,
) -> None:
    args = ["plan", "parallel.dp=2", "wandb.mode=disabled"]
    bad = run_launch(args, tmp_path / "bad", env={"LAUNCHER_RANK_START": "frok"}, check=False)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    line = next(line for line in bad.stderr.splitlines() if "Fix:" in line)
    assert "LAUNCHER_RANK_START='frok'" in line and "Traceback" not in bad.stderr
    assert not (tmp_path / "bad").exists()  # nothing written
    exports = re.findall(r"`export (\w+)=(\w+)`", line.split("Fix:", 1)[1])
    assert exports == [("LAUNCHER_RANK_START", "exec")]
    fixed = run_launch(args, tmp_path / "fixed", env=dict(exports))
    assert fixed.returncode == 0 and "command" in fixed.stdout
