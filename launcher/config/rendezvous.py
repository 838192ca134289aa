"""cluster=torchrun: this node's rendezvous values, from the config or from the environment that
the engine starting the node set, each with where it came from (`launch plan` prints them).

An explicit key wins; else the first of these that is set (docs/multinode.md):

    parallel.nodes         PET_NNODES (torchrun's, set by Kubeflow Trainer), SKYPILOT_NUM_NODES
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
    """An environment variable's whole number (PET_NNODES may be MIN:MAX: its MAX)."""
    text = value.split(":")[-1]
    if not text.isdigit():
        raise ConfigError(
            key,
            f"{name}={value!r} in this node's environment is not a whole number.",
            f"set {key} explicitly, or unset {name}.",
        )
    return int(text)


def _nodes(cfg: RootConfig, env: Mapping[str, str]) -> tuple[int, str]:
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
        return explicit, "parallel.nodes"
    name, value = found
    nodes = _count("parallel.nodes", name, value)
    if explicit is not None and nodes != explicit:
        per_node = parallel.ranks_per_node
        raise ConfigError(
            ["parallel.nodes", name],
            f"parallel.nodes={explicit}, but {name}={value} in this node's environment says "
            f"{nodes}.",
            f"make them agree: parallel.nodes={nodes} parallel.dp={nodes * per_node}, or start "
            f"the nodes with {name}={explicit}.",
        )
    return nodes, f"{name}={value}" + (" (agrees with parallel.nodes)" if explicit else "")


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


def resolve_rendezvous(
    cfg: RootConfig, run_dir: Path, env: Mapping[str, str]
) -> tuple[RootConfig, NodeRendezvous]:
    """The config with the job's node count, endpoint and id filled in (the same on every node:
    config.yaml holds them), and this node's rendezvous."""
    nodes, nodes_from = _nodes(cfg, env)
    if nodes != cfg.parallel.nodes:
        cfg = replace(cfg, parallel=replace(cfg.parallel, nodes=nodes))
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
            "cluster.rdzv_endpoint": endpoint_from,
            "cluster.node_rank": rank_from,
            "cluster.rdzv_id": id_from,
        },
    )
    cluster = replace(cfg.cluster, rdzv_endpoint=found.endpoint, rdzv_id=rdzv_id)
    return replace(cfg, cluster=cluster), found
