"""nodes.txt's header names the node whose view of the rendezvous it holds."""

from __future__ import annotations

from pathlib import Path

from launcher.config.rendezvous import NodeRendezvous
from launcher.runners.torchrun_nodes import nodes_text


def rendezvous(node_rank: int | None) -> NodeRendezvous:
    sources = {
        "parallel.nodes": "PET_NNODES=2",
        "cluster.rdzv_endpoint": "PET_MASTER_ADDR, PET_MASTER_PORT",
        "cluster.rdzv_id": "the run directory's name",
        "cluster.node_rank": f"PET_NODE_RANK={node_rank}",
    }
    return NodeRendezvous("h", 29500, "exp1", 2, 2, node_rank, 600, sources)


def test_launch_plan_on_node_1_says_node_1_not_node_0() -> None:
    """`launch plan` with PET_NODE_RANK=1 prints node 1's values (its rank 1): the header said
    'as node 0 read them'."""
    text = nodes_text(Path("/shared/exp1"), rendezvous(1))
    assert "# the rendezvous values as node 1 read them" in text
    assert "PET_NODE_RANK=1" in text
    assert "as node 0 read them" in nodes_text(Path("/shared/exp1"), rendezvous(0))
    assert "as node 0 read them" in nodes_text(Path("/shared/exp1"), rendezvous(None))
