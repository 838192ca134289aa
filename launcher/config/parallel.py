"""Data parallelism and the batch split."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.checks import require_positive
from launcher.errors import ConfigError


@dataclass
class ParallelConfig:
    """How many data-parallel ranks, over how many nodes."""

    dp: int = 1
    """Data-parallel ranks in all (world size). Ranks per node = dp / nodes."""
    nodes: int = 1
    """Nodes to spread the ranks over; more than one needs cluster=slurm."""

    def __post_init__(self) -> None:
        require_positive("parallel.dp", self.dp)
        require_positive("parallel.nodes", self.nodes)
        if self.dp % self.nodes:
            raise ConfigError(
                ["parallel.dp", "parallel.nodes"],
                f"dp={self.dp} ranks do not split evenly over nodes={self.nodes}.",
                "make parallel.dp a multiple of parallel.nodes (e.g. "
                f"parallel.dp={self.nodes * max(1, self.dp // self.nodes)}).",
            )

    @property
    def ranks_per_node(self) -> int:
        return self.dp // self.nodes


@dataclass
class BatchConfig:
    """Sequences per optimizer step, split as dp x grad_accum x micro_size.

    Any two of global_size, micro_size and grad_accum (with parallel.dp) determine the third;
    leave the third null. With only global_size set, grad_accum defaults to 1.
    """

    global_size: int | None = 32
    """Sequences per optimizer step over all ranks and micro-batches."""
    micro_size: int | None = None
    """Sequences per rank per micro-batch (forward/backward at once)."""
    grad_accum: int | None = None
    """Micro-batches per rank per optimizer step."""

    def __post_init__(self) -> None:
        require_positive("batch.global_size", self.global_size, allow_none=True)
        require_positive("batch.micro_size", self.micro_size, allow_none=True)
        require_positive("batch.grad_accum", self.grad_accum, allow_none=True)
