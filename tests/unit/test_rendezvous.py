"""cluster=torchrun's values: from the keys, else from the environment an engine set, in the
documented order, each with its source; disagreements and missing values are one ConfigError."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from launcher.config import to_root_config
from launcher.config.rendezvous import resolve_rendezvous
from launcher.config.root import RootConfig
from launcher.errors import ConfigError

RUN = Path("/shared/runs/exp-1")
CONF = Path(__file__).resolve().parents[2] / "conf"


def torchrun(parallel: dict | None = None, **cluster: object) -> RootConfig:
    parallel = parallel or {"dp": 2}
    return to_root_config(
        {
            "cluster": {"name": "torchrun", **cluster},
            "parallel": parallel,
            "batch": {"global_size": 12 * parallel["dp"]},
        }
    )


KUBEFLOW = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "1",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "job-node-0-0.job",
    "PET_MASTER_PORT": "29400",
    "MASTER_ADDR": "elsewhere",
    "NODE_RANK": "0",
}


def test_kubeflow_pet_variables_alone() -> None:
    cfg, rdzv = resolve_rendezvous(torchrun(), RUN, KUBEFLOW)
    assert (rdzv.host, rdzv.port, rdzv.nodes, rdzv.node_rank) == ("job-node-0-0.job", 29400, 2, 1)
    assert rdzv.rdzv_id == "exp-1"
    assert cfg.parallel.nodes == 2 and cfg.parallel.ranks_per_node == 1
    assert cfg.cluster.rdzv_endpoint == "job-node-0-0.job:29400"
    assert rdzv.sources == {
        "parallel.nodes": "PET_NNODES=2",
        "cluster.rdzv_endpoint": "PET_MASTER_ADDR, PET_MASTER_PORT",
        "cluster.node_rank": "PET_NODE_RANK=1",
        "cluster.rdzv_id": "the run directory's name",
    }


def test_master_addr_and_node_rank_then_skypilot() -> None:
    env = {"MASTER_ADDR": "10.0.0.5", "NODE_RANK": "0", "SKYPILOT_NUM_NODES": "2"}
    _, rdzv = resolve_rendezvous(torchrun(), RUN, env)
    assert (rdzv.endpoint, rdzv.node_rank) == ("10.0.0.5:29500", 0)  # torchrun's default port
    assert rdzv.sources["cluster.rdzv_endpoint"] == "MASTER_ADDR"
    sky = {
        "SKYPILOT_NODE_IPS": "10.1.0.7\n10.1.0.8\n10.1.0.9",
        "SKYPILOT_NUM_NODES": "3",
        "SKYPILOT_NODE_RANK": "2",
    }
    cfg, rdzv = resolve_rendezvous(torchrun({"dp": 3}), RUN, sky)
    assert (rdzv.endpoint, rdzv.nodes, rdzv.node_rank) == ("10.1.0.7:29500", 3, 2)
    assert cfg.parallel.nodes == 3
    assert rdzv.sources["cluster.rdzv_endpoint"].startswith("SKYPILOT_NODE_IPS")


def test_explicit_keys_win() -> None:
    cfg = torchrun(
        {"dp": 2, "nodes": 2}, rdzv_endpoint="127.0.0.1:1234", node_rank=0, rdzv_id="mine"
    )
    _, rdzv = resolve_rendezvous(cfg, RUN, KUBEFLOW)
    assert (rdzv.endpoint, rdzv.node_rank, rdzv.rdzv_id) == ("127.0.0.1:1234", 0, "mine")
    assert rdzv.sources["cluster.rdzv_endpoint"] == "cluster.rdzv_endpoint"
    assert rdzv.sources["parallel.nodes"] == "PET_NNODES=2 (agrees with parallel.nodes)"


def test_a_disagreement_names_both() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_rendezvous(torchrun({"dp": 2, "nodes": 2}), RUN, {**KUBEFLOW, "PET_NNODES": "4"})
    assert info.value.keys == ["parallel.nodes", "PET_NNODES"]
    assert "parallel.nodes=2, but PET_NNODES=4" in str(info.value)
    assert "parallel.nodes=4 parallel.dp=4" in info.value.fix
    with pytest.raises(ConfigError) as info:
        resolve_rendezvous(torchrun({"dp": 4}), RUN, KUBEFLOW)  # 2 per node, PET says 1
    assert info.value.keys == ["parallel.dp", "PET_NPROC_PER_NODE"]
    assert "parallel.dp=2" in info.value.fix


def test_pet_nnodes_min_max_is_an_elastic_job_with_its_restarts() -> None:
    env = {**KUBEFLOW, "PET_NNODES": "1:2"}
    cfg, rdzv = resolve_rendezvous(torchrun({"dp": 2}), RUN, env)
    assert (cfg.parallel.nodes, cfg.parallel.min_nodes, cfg.parallel.elastic) == (2, 1, True)
    assert (rdzv.nodes, rdzv.least_nodes) == (2, 1)
    assert cfg.restarts == 3  # an elastic job's default, not the fixed job's 0
    assert rdzv.sources["parallel.min_nodes"] == "PET_NNODES=1:2"
    explicit = torchrun({"dp": 2}, rdzv_endpoint="h:1")
    explicit.train.max_restarts = 5  # as if given: kept
    cfg, _ = resolve_rendezvous(explicit, RUN, {"PET_NNODES": "1:2"})
    assert cfg.restarts == 5
    same, _ = resolve_rendezvous(torchrun({"dp": 2}), RUN, {**KUBEFLOW, "PET_NNODES": "2:2"})
    assert not same.parallel.elastic and same.restarts == 0


def test_min_nodes_with_the_node_count_from_the_environment() -> None:
    """parallel.min_nodes=2 on a job whose 3 nodes come from PET_NNODES (parallel.nodes left out,
    as docs/multinode.md says): elastic 2..3, not refused against the default parallel.nodes=1."""
    env = {**KUBEFLOW, "PET_NNODES": "3"}
    three = to_root_config(
        {
            "cluster": {"name": "torchrun"},
            "parallel": {"dp": 3, "min_nodes": 2},
            "batch": {"global_size": 36, "micro_size": 6},  # whole micro-batches on 2 nodes too
        }
    )
    cfg, rdzv = resolve_rendezvous(three, RUN, env)
    assert (cfg.parallel.nodes, cfg.parallel.min_nodes, cfg.parallel.elastic) == (3, 2, True)
    assert (rdzv.nodes, rdzv.least_nodes) == (3, 2) and cfg.restarts == 3
    with pytest.raises(ConfigError) as info:  # fewer nodes than the fewest: names both
        resolve_rendezvous(torchrun({"dp": 2, "min_nodes": 3}), RUN, KUBEFLOW)
    assert info.value.keys == ["parallel.min_nodes", "PET_NNODES"]
    assert "parallel.min_nodes=2" in info.value.fix
    resolve_rendezvous(torchrun({"dp": 2, "min_nodes": 2}), RUN, KUBEFLOW)  # the fix, as printed
    with pytest.raises(ConfigError, match="between 1 and nodes=1"):  # no environment to fill it
        to_root_config({"parallel": {"dp": 2, "min_nodes": 2}})


@pytest.mark.parametrize(
    ("env", "config", "words"),
    [
        ("1:2", {"dp": 2, "nodes": 2, "min_nodes": 2}, "parallel.min_nodes=2, but PET_NNODES=1:2"),
        ("1:2", {"dp": 2, "min_nodes": 2}, "parallel.min_nodes=2, but PET_NNODES=1:2"),
        ("3:2", {"dp": 2}, "PET_NNODES=3:2 in this node's environment is not MIN:MAX"),
        ("0:2", {"dp": 2}, "is not MIN:MAX"),
        ("1:x", {"dp": 2}, "'1:x'"),
    ],
)
def test_a_bad_or_disagreeing_node_range_is_refused(env: str, config: dict, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_rendezvous(torchrun(config), RUN, {**KUBEFLOW, "PET_NNODES": env})
    assert words in str(info.value) and info.value.fix


@pytest.mark.parametrize(
    ("cluster", "env", "key", "words"),
    [
        ({}, {"PET_NNODES": "2"}, "cluster.rdzv_endpoint", "PET_MASTER_ADDR, MASTER_ADDR"),
        ({"rdzv_endpoint": "h:1"}, {}, "parallel.nodes", "parallel.nodes is 1"),
        ({"rdzv_endpoint": "h:1"}, {"PET_NNODES": "two"}, "parallel.nodes", "'two'"),
        ({"node_rank": 2}, {"PET_NNODES": "2", "MASTER_ADDR": "h"}, "cluster.node_rank", "0 to 1"),
        ({}, {"PET_NNODES": "2", "MASTER_ADDR": "h", "MASTER_PORT": "99999"}, "", "HOST:PORT"),
    ],
)
def test_missing_or_bad_values(cluster: dict, env: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_rendezvous(torchrun(**cluster), RUN, env)
    assert key in info.value.keys[0] and words in str(info.value)
    assert info.value.fix


@pytest.mark.parametrize(
    ("cluster", "key"),
    [
        ({"rdzv_endpoint": "no-port"}, "cluster.rdzv_endpoint"),
        ({"rdzv_endpoint": "h:0"}, "cluster.rdzv_endpoint"),
        ({"rdzv_id": "a b"}, "cluster.rdzv_id"),
        ({"node_rank": -1}, "cluster.node_rank"),
        ({"rdzv_timeout": 0}, "cluster.rdzv_timeout"),
        ({"rdzv_last_call": 0}, "cluster.rdzv_last_call"),
        ({"rdzv_keep_alive": -1}, "cluster.rdzv_keep_alive"),
    ],
)
def test_bad_keys_are_refused_where_defined(cluster: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        torchrun(**cluster)
    assert info.value.keys == [key]


def test_a_bare_ipv6_address_from_the_environment_is_bracketed() -> None:
    env = {"PET_NNODES": "2", "PET_MASTER_ADDR": "::1", "PET_MASTER_PORT": "29511"}
    cfg, rdzv = resolve_rendezvous(torchrun(), RUN, env)
    assert (rdzv.host, rdzv.port, rdzv.endpoint) == ("::1", 29511, "[::1]:29511")
    assert cfg.cluster.rdzv_endpoint == "[::1]:29511"
    sky = {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_IPS": "fd00::7\nfd00::8"}
    _, rdzv = resolve_rendezvous(torchrun(), RUN, sky)
    assert rdzv.endpoint == "[fd00::7]:29500"


def test_an_unquoted_ipv6_endpoint_is_told_the_quoting_that_reads() -> None:
    """Hydra's grammar reads [fd00::1]:29500 as a broken list; the Fix, as printed, parses."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from launcher.config.overrides import check_overrides

    with pytest.raises(ConfigError) as info:
        check_overrides(["cluster.rdzv_endpoint=[fd00::1]:29500"], CONF)
    fixed = shlex.split(info.value.fix.split(": ", 1)[1].removesuffix("."))
    assert fixed == ['cluster.rdzv_endpoint="[fd00::1]:29500"']
    check_overrides(fixed, CONF)
    assert OverridesParser.create().parse_override(fixed[0]).value() == "[fd00::1]:29500"
