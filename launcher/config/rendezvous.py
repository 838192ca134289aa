"""cluster=torchrun: this node's rendezvous values, from the config or from the environment that
the engine starting the node set, each with where it came from (`launch plan` prints them).

An explicit key wins; else the first of these that is set (docs/multinode.md):

    parallel.nodes         PET_NNODES (torchrun's, set by Kubeflow Trainer), SKYPILOT_NUM_NODES
    parallel.min_nodes     PET_NNODES=MIN:MAX (an elastic job: MIN to MAX nodes)
    cluster.node_rank      PET_NODE_RANK, NODE_RANK, SKYPILOT_NODE_RANK
    cluster.rdzv_endpoint  PET_RDZV_ENDPOINT, PET_MASTER_ADDR:PET_MASTER_PORT,
                           MASTER_ADDR:MASTER_PORT, SKYPILOT_NODE_IPS's first line (a port
                           missing: MASTER_PORT, else 29500, torchrun's default)
    cluster.rdzv_id        PET_RDZV_ID, else the run directory's name

A node count, or ranks per node (PET_NPROC_PER_NODE), that the environment and the config
disagree on is one error naming both: a wrong count would wait for a node that never comes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from launcher.config.cluster import ENDPOINT_EXAMPLE, split_endpoint
from launcher.config.root import RootConfig
from launcher.errors import ConfigError

DEFAULT_PORT = 29500
"""torchrun's default master port, for an address given without one."""
NODES_ENV = ("PET_NNODES", "SKYPILOT_NUM_NODES")
NODE_RANK_ENV = ("PET_NODE_RANK", "NODE_RANK", "SKYPILOT_NODE_RANK")
ADDRESS_ENV = (("PET_MASTER_ADDR", "PET_MASTER_PORT"), ("MASTER_ADDR", "MASTER_PORT"))
ENDPOINT_ENV = "PET_RDZV_ENDPOINT"
ID_ENV = "PET_RDZV_ID"
NPROC_ENV = "PET_NPROC_PER_NODE"
SKYPILOT_IPS = "SKYPILOT_NODE_IPS"
ADDRESS_NAMES = (ENDPOINT_ENV, "PET_MASTER_ADDR", "MASTER_ADDR", SKYPILOT_IPS)


@dataclass(frozen=True)
class NodeRendezvous:
    """Where the nodes of one job meet, and this node's place."""

    host: str
    port: int
    rdzv_id: str
    nodes: int
    least_nodes: int
    node_rank: int | None
    """None: assigned at the rendezvous (the node holding the endpoint's port is node 0)."""
    timeout: int
    sources: dict[str, str] = field(default_factory=dict)
    """key -> where its value came from, in words."""

    @property
    def endpoint(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def join_host(host: str, port: str) -> str:
    """HOST:PORT, a bare IPv6 address in brackets ([::1]:29500)."""
    bare = ":" in host and not host.startswith("[")
    return f"[{host}]:{port}" if bare else f"{host}:{port}"


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    """(name, value) of the first of `names` set to a non-blank value."""
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


def _count(key: str, name: str, value: str) -> int:
    """An environment variable's whole number."""
    if not value.isdigit():
        raise ConfigError(
            key,
            f"{name}={value!r} in this node's environment is not a whole number.",
            f"set {key} explicitly, or unset {name}.",
        )
    return int(value)


def _node_range(name: str, value: str) -> tuple[int, int]:
    """PET_NNODES as torchrun reads it: N, or MIN:MAX (an elastic job of MIN to MAX nodes)."""
    match = re.fullmatch(r"(\d+)(?::(\d+))?", value)
    if match is None:
        raise ConfigError(
            "parallel.nodes",
            f"{name}={value!r} in this node's environment is not a whole number (or MIN:MAX).",
            f"set parallel.nodes explicitly, or unset {name}.",
        )
    least, nodes = int(match[1]), int(match[2] or match[1])
    if not 1 <= least <= nodes:
        raise ConfigError(
            ["parallel.min_nodes", name],
            f"{name}={value} in this node's environment is not MIN:MAX with 1 <= MIN <= MAX.",
            f"start the nodes with {name}=MIN:MAX (e.g. {name}=1:{max(nodes, 2)}), or unset it "
            "and set parallel.nodes (and parallel.min_nodes) explicitly.",
        )
    return least, nodes


def _nodes(cfg: RootConfig, env: Mapping[str, str]) -> tuple[int, int | None, str]:
    """The job's nodes, its fewest nodes where the environment gives a range (None: the
    config's parallel.min_nodes stands), and where the count came from."""
    parallel = cfg.parallel
    found = _first(env, NODES_ENV)
    explicit = parallel.nodes if parallel.nodes > 1 else None
    if found is None:
        if explicit is None:
            raise ConfigError(
                ["parallel.nodes", "cluster"],
                "cluster=torchrun joins several nodes, but parallel.nodes is 1 and none of "
                f"{', '.join(NODES_ENV)} is set.",
                f"set the nodes and the ranks in all, e.g. parallel.nodes=2 "
                f"parallel.dp={2 * parallel.dp} ({parallel.dp} per node); or use cluster=local "
                "for this machine alone.",
            )
        return explicit, None, "parallel.nodes"
    name, value = found
    least, nodes = _node_range(name, value)
    if explicit is not None and nodes != explicit:
        per_node = parallel.ranks_per_node
        raise ConfigError(
            ["parallel.nodes", name],
            f"parallel.nodes={explicit}, but {name}={value} in this node's environment says "
            f"{nodes}.",
            f"make them agree: parallel.nodes={nodes} parallel.dp={nodes * per_node}, or start "
            f"the nodes with {name}={explicit}.",
        )
    ranged = ":" in value
    if ranged and parallel.min_nodes is not None and parallel.min_nodes != least:
        raise ConfigError(
            ["parallel.min_nodes", name],
            f"parallel.min_nodes={parallel.min_nodes}, but {name}={value} in this node's "
            f"environment says at least {least} node(s).",
            f"make them agree: parallel.min_nodes={least}, or start the nodes with "
            f"{name}={parallel.min_nodes}:{nodes}.",
        )
    if not ranged and (parallel.min_nodes or 1) > nodes:
        raise ConfigError(
            ["parallel.min_nodes", name],
            f"parallel.min_nodes={parallel.min_nodes}, but {name}={value} in this node's "
            f"environment says the job has {nodes} node(s).",
            f"make them agree: parallel.min_nodes={nodes}, or start the nodes with "
            f"{name}={parallel.min_nodes} (or more).",
        )
    where = f"{name}={value}" + (" (agrees with parallel.nodes)" if explicit else "")
    return nodes, least if ranged else None, where


def _endpoint(cfg: RootConfig, env: Mapping[str, str]) -> tuple[str, int, str]:
    given = cfg.cluster.rdzv_endpoint
    if given is not None:
        return (*split_endpoint("cluster.rdzv_endpoint", given), "cluster.rdzv_endpoint")
    if env.get(ENDPOINT_ENV, "").strip():
        value = env[ENDPOINT_ENV].strip()
        return (*split_endpoint(ENDPOINT_ENV, value), ENDPOINT_ENV)
    for address, port_name in ADDRESS_ENV:
        host = env.get(address, "").strip()
        if host:
            port = env.get(port_name, "").strip() or str(DEFAULT_PORT)
            where = f"{address}, {port_name}" if env.get(port_name, "").strip() else address
            return (*split_endpoint(f"{address}:{port_name}", join_host(host, port)), where)
    ips = env.get(SKYPILOT_IPS, "").split()
    if ips:
        port = env.get("MASTER_PORT", "").strip() or str(DEFAULT_PORT)
        host, number = split_endpoint(SKYPILOT_IPS, join_host(ips[0], port))
        return host, number, f"{SKYPILOT_IPS} (its first node), port {number}"
    raise ConfigError(
        "cluster.rdzv_endpoint",
        "cluster=torchrun needs the address where the nodes meet, and none is set: not the "
        f"key, nor {', '.join(ADDRESS_NAMES)} in this node's environment.",
        f"add {ENDPOINT_EXAMPLE} (the first node's address and a free port, the same on every "
        "node).",
    )


def _node_rank(cfg: RootConfig, env: Mapping[str, str], nodes: int) -> tuple[int | None, str]:
    rank, where = cfg.cluster.node_rank, "cluster.node_rank"
    found = _first(env, NODE_RANK_ENV)
    if rank is None and found is not None:
        rank, where = _count("cluster.node_rank", *found), f"{found[0]}={found[1]}"
    if rank is None:
        return None, "assigned at the rendezvous (the node holding the endpoint's port is 0)"
    if rank >= nodes:
        raise ConfigError(
            "cluster.node_rank",
            f"{rank} (from {where}), but the job has {nodes} node(s), ranks 0 to {nodes - 1}.",
            f"give each node its own rank from 0 to {nodes - 1}, e.g. cluster.node_rank="
            f"{nodes - 1}.",
        )
    return rank, where


def _check_ranks_per_node(cfg: RootConfig, env: Mapping[str, str]) -> None:
    value = env.get(NPROC_ENV, "").strip()
    per_node = cfg.parallel.ranks_per_node
    if value.isdigit() and int(value) != per_node:
        nodes = cfg.parallel.nodes
        raise ConfigError(
            ["parallel.dp", NPROC_ENV],
            f"parallel.dp={cfg.parallel.dp} over {nodes} node(s) is {per_node} rank(s) per node, "
            f"but {NPROC_ENV}={value} in this node's environment.",
            f"make them agree: parallel.dp={nodes * int(value)}, or start the nodes with "
            f"{NPROC_ENV}={per_node}.",
        )


def _rdzv_id(cfg: RootConfig, env: Mapping[str, str], run_dir: Path) -> tuple[str, str]:
    if cfg.cluster.rdzv_id is not None:
        return cfg.cluster.rdzv_id, "cluster.rdzv_id"
    if env.get(ID_ENV, "").strip():
        value = env[ID_ENV].strip()
        if re.fullmatch(r"[A-Za-z0-9._-]{1,128}", value):
            return value, ID_ENV
    name = re.sub(r"[^A-Za-z0-9._-]", "-", run_dir.name)[:128] or "launcher"
    return name, "the run directory's name"


def _with_nodes(cfg: RootConfig, nodes: int, least: int | None) -> RootConfig:
    """The config on `nodes` nodes, elastic down to `least` where the environment says so (its
    restarts derived again: a job made elastic by the environment needs them)."""
    parallel = cfg.parallel
    min_nodes = parallel.min_nodes if least is None or least == nodes else least
    if (nodes, min_nodes) == (parallel.nodes, parallel.min_nodes):
        return cfg
    train = cfg.train
    if min_nodes is not None and min_nodes < nodes and not parallel.elastic:
        # max_restarts was resolved for a job that was not elastic (0 from null)
        train = replace(train, max_restarts=train.max_restarts or None)
    return replace(cfg, parallel=replace(parallel, nodes=nodes, min_nodes=min_nodes), train=train)


def resolve_rendezvous(
    cfg: RootConfig, run_dir: Path, env: Mapping[str, str]
) -> tuple[RootConfig, NodeRendezvous]:
    """The config with the job's node count, endpoint and id filled in (the same on every node:
    config.yaml holds them), and this node's rendezvous."""
    nodes, least, nodes_from = _nodes(cfg, env)
    cfg = _with_nodes(cfg, nodes, least)
    min_from = "parallel.min_nodes" if least is None or least == nodes else nodes_from
    _check_ranks_per_node(cfg, env)
    host, port, endpoint_from = _endpoint(cfg, env)
    rank, rank_from = _node_rank(cfg, env, nodes)
    rdzv_id, id_from = _rdzv_id(cfg, env, run_dir)
    found = NodeRendezvous(
        host=host,
        port=port,
        rdzv_id=rdzv_id,
        nodes=nodes,
        least_nodes=cfg.parallel.least_nodes,
        node_rank=rank,
        timeout=cfg.cluster.rdzv_timeout,
        sources={
            "parallel.nodes": nodes_from,
            **({"parallel.min_nodes": min_from} if cfg.parallel.elastic else {}),
            "cluster.rdzv_endpoint": endpoint_from,
            "cluster.node_rank": rank_from,
            "cluster.rdzv_id": id_from,
        },
    )
    cluster = replace(cfg.cluster, rdzv_endpoint=found.endpoint, rdzv_id=rdzv_id)
    return replace(cfg, cluster=cluster), found
