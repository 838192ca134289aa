"""Data parallelism and the batch split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.config.checks import require_positive
from launcher.errors import ConfigError

AUTO = "auto"
"""batch.micro_size=auto: the plan picks the micro size (launcher/memory/auto.py)."""

if TYPE_CHECKING:
    MicroSize = int | str | None
else:  # OmegaConf 2.3 has no unions: an open node, checked in BatchConfig.__post_init__
    MicroSize = Any


@dataclass
class ParallelConfig:
    """The device mesh: pipeline x data-parallel x tensor-parallel ranks, over how many nodes."""

    dp: int = 1
    """Data-parallel degree: distinct micro-batch streams. The world is dp x tp x pp ranks; ranks
    per node = dp x tp x pp / nodes."""
    nodes: int = 1
    """Nodes to spread the ranks over; more than one needs cluster=slurm or cluster=torchrun
    (with cluster=torchrun, left at 1: PET_NNODES or SKYPILOT_NUM_NODES, docs/multinode.md)."""
    min_nodes: int | None = None
    """Elastic: the job goes on (restarted from the newest checkpoint, the same global batch) on
    as few as this many nodes when nodes are lost. null: parallel.nodes (not elastic)."""
    replicate: int | None = None
    """engine=fsdp: hybrid sharding (HSDP), state sharded over dp / replicate ranks and replicated
    over `replicate` groups. null: the number of nodes on a multi-node job with more than one rank
    per node (all-gathers stay inside a node), else 1 (plain FSDP)."""
    tp: int = 1
    """Tensor parallelism: ranks of one tensor-parallel group (they share micro-batches and split
    every layer's weights; heads stay whole on a rank). A group stays inside a node."""
    sequence_parallel: bool | None = None
    """With tp > 1: norms and dropout on sequence shards between the tensor-parallel regions
    (less activation memory, the same numbers). null: true when tp > 1."""
    pp: int = 1
    """Pipeline parallelism: stages of consecutive blocks on pp ranks (the outermost dimension of
    the mesh), fed the accumulation's micro-batches (docs/parallelism.md)."""
    pp_schedule: str = "1f1b"
    """With pp > 1: gpipe | 1f1b | interleaved_1f1b, the order the stages run the micro-batches
    in (1f1b: at least pp micro-batches, batch.grad_accum >= pp)."""
    pp_stages_per_rank: int | None = None
    """Virtual stages per pipeline rank (stage s on rank s % pp): null = 2 for interleaved_1f1b,
    else 1; gpipe and 1f1b run one."""
    pp_split: list[int] | None = None
    """With pp > 1: the block indices where stages 1, 2, ... start (pp x stages per rank - 1 of
    them, increasing), e.g. [3] for 2 stages over 4 blocks. null: balanced by the memory plan
    (each block's state and activations, the embedding on the first stage, the final norm and
    head on the last), resolved by the plan into the config the ranks run."""

    def __post_init__(self) -> None:
        require_positive("parallel.dp", self.dp)
        require_positive("parallel.tp", self.tp)
        require_positive("parallel.pp", self.pp)
        require_positive("parallel.nodes", self.nodes)
        require_positive("parallel.replicate", self.replicate, allow_none=True)
        if self.nodes > 1 or (self.min_nodes is not None and self.min_nodes < 1):
            # parallel.nodes left at 1 may be filled from the environment (cluster=torchrun):
            # RootConfig checks min_nodes against it for the other clusters
            self.check_min_nodes()
        if self.replicate is not None and self.dp % self.replicate:
            raise ConfigError(
                ["parallel.replicate", "parallel.dp"],
                f"dp={self.dp} ranks do not split into replicate={self.replicate} equal groups.",
                "make parallel.replicate a divisor of parallel.dp (e.g. "
                f"parallel.replicate={self.nodes if self.dp % self.nodes == 0 else 1}).",
            )
        if self.tp > 1 and self.nodes > 1 and (self.dp * self.pp) % self.nodes:
            raise ConfigError(
                ["parallel.tp", "parallel.dp", "parallel.nodes"],
                f"dp={self.dp} x tp={self.tp} ranks over nodes={self.nodes} would put a "
                "tensor-parallel group on two nodes (its collectives run on every layer).",
                "make parallel.dp a multiple of parallel.nodes (e.g. "
                f"parallel.dp={self.nodes * max(1, self.dp // self.nodes)}), so that each node "
                "holds whole tensor-parallel groups.",
            )
        if self.world % self.nodes:
            raise ConfigError(
                ["parallel.dp", "parallel.nodes"],
                f"{self._layout()} ranks do not split evenly over nodes={self.nodes}.",
                "make parallel.dp a multiple of parallel.nodes (e.g. "
                f"parallel.dp={self.nodes * max(1, self.dp // self.nodes)}).",
            )

    def check_min_nodes(self) -> None:
        """parallel.min_nodes from 1 to parallel.nodes (or null)."""
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise ConfigError(
                ["parallel.min_nodes", "parallel.nodes"],
                f"min_nodes={self.min_nodes} is not between 1 and nodes={self.nodes}.",
                f"set parallel.min_nodes to a value from 1 to {self.nodes}, or null (not elastic).",
            )

    @property
    def world(self) -> int:
        """Ranks in all: dp x tp x pp."""
        return self.dp * self.tp * self.pp

    def _layout(self) -> str:
        extra = "".join(f" x {k}={v}" for k, v in (("tp", self.tp), ("pp", self.pp)) if v > 1)
        return f"dp={self.dp}{extra}"

    @property
    def sequence_sharded(self) -> bool:
        """Sequence parallelism on: tp > 1 and parallel.sequence_parallel not false."""
        return self.tp > 1 and self.sequence_parallel is not False

    @property
    def ranks_per_node(self) -> int:
        return self.world // self.nodes

    @property
    def least_nodes(self) -> int:
        """parallel.min_nodes, or parallel.nodes when null."""
        return self.nodes if self.min_nodes is None else self.min_nodes

    @property
    def elastic(self) -> bool:
        return self.least_nodes < self.nodes

    def default_replicate(self) -> int:
        """parallel.replicate=null under FSDP: one replica per node when a node holds several
        ranks (shard within the node's fast links, replicate across nodes), else 1."""
        return self.nodes if self.nodes > 1 and self.ranks_per_node > 1 else 1


@dataclass
class BatchConfig:
    """Sequences per optimizer step, split as dp x grad_accum x micro_size.

    Any two of global_size, micro_size and grad_accum (with parallel.dp) determine the third;
    leave the third null. With only global_size set, grad_accum defaults to 1.
    """

    global_size: int | None = 32
    """Sequences per optimizer step over all ranks and micro-batches."""
    micro_size: MicroSize = None
    """Sequences per rank per micro-batch (forward/backward at once), or auto: the largest that
    fits train.memory_budget (docs/memory.md)."""
    grad_accum: int | None = None
    """Micro-batches per rank per optimizer step."""

    def __post_init__(self) -> None:
        require_positive("batch.global_size", self.global_size, allow_none=True)
        self.micro_size = _micro_size(self.micro_size)
        require_positive("batch.micro_size", self.micro, allow_none=True)
        require_positive("batch.grad_accum", self.grad_accum, allow_none=True)
        if self.auto and (self.grad_accum is not None or self.global_size is None):
            raise ConfigError(
                ["batch.micro_size", "batch.grad_accum", "batch.global_size"],
                "batch.micro_size=auto splits a given global batch and derives grad_accum.",
                "set batch.global_size and leave batch.grad_accum=null.",
            )

    @property
    def auto(self) -> bool:
        return self.micro_size == AUTO

    @property
    def micro(self) -> int | None:
        """The micro size as a number; None when derived (null) or chosen by the plan (auto)."""
        return None if self.micro_size is None or self.auto else int(self.micro_size)


def _micro_size(value: Any) -> int | str | None:
    """batch.micro_size: a whole number, null or auto (parsed here only)."""
    if value is None or value == AUTO:
        return value
    if isinstance(value, bool):
        value = "true" if value else "false"
    if isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit()):
        return int(value)
    raise ConfigError(
        "batch.micro_size",
        f"{value!r} is not a whole number or auto.",
        "give a whole number (e.g. batch.micro_size=4), or auto to fit train.memory_budget.",
    )
