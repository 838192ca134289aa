"""Where the job runs: this machine, or SLURM."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from launcher.config.checks import require_non_negative


class ClusterKind(str, Enum):
    local = "local"
    slurm = "slurm"


@dataclass
class ClusterConfig:
    """cluster=local runs here; cluster=slurm renders train.sbatch and submits it."""

    name: ClusterKind = ClusterKind.local
    """local | slurm."""
    job_name: str = "launcher"
    """slurm: job name (letters, digits, '-', '_', '.')."""
    partition: str | None = None
    """slurm: partition (null: the cluster's default)."""
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time: str = "01:00:00"
    """slurm: time limit, [D-]HH:MM:SS."""
    gpus_per_node: int = 0
    """slurm: GPUs per node (0 for CPU jobs)."""
    cpus_per_task: int | None = None
    """slurm: CPUs for each node's task (null: the cluster's default)."""
    mem: str | None = None
    """slurm: memory per node, e.g. 64G (null: the cluster's default)."""
    signal_seconds: int = 120
    """slurm: USR1 this many seconds before the time limit, to checkpoint and requeue."""
    max_requeues: int = 3
    """slurm: requeue a preempted job at most this many times."""
    port: int = 29500
    """slurm: c10d rendezvous port on the first node."""
    wait: bool = False
    """slurm: wait for the job to end and exit with its status."""
    extra_directives: list[str] = field(default_factory=list)
    """slurm: further #SBATCH options, e.g. ['--exclusive']."""
    setup: list[str] = field(default_factory=list)
    """slurm: shell lines run before training (module load, source venv/bin/activate)."""

    def __post_init__(self) -> None:
        require_non_negative("cluster.gpus_per_node", self.gpus_per_node)
        require_non_negative("cluster.signal_seconds", self.signal_seconds)
        require_non_negative("cluster.max_requeues", self.max_requeues)
