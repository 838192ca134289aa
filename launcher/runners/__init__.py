"""Plan -> process: in-process for one rank, torchrun for several, sbatch for SLURM.

`runner_for` is the one place that looks at the cluster and the data-parallel size to decide.
The runner modules are imported when chosen: what each SLURM node runs
(`python -m launcher.runners.slurm_node`) stays light.
"""

from __future__ import annotations

from launcher.config.cluster import ClusterKind
from launcher.config.root import RootConfig
from launcher.runners.base import Runner


def runner_for(cfg: RootConfig) -> Runner:
    """Where this config runs: SLURM for cluster=slurm, a node of several for cluster=torchrun,
    else torchrun for dp x tp > 1, else in-process."""
    if cfg.cluster.name == ClusterKind.slurm:
        from launcher.runners.slurm import SlurmRunner

        return SlurmRunner()
    if cfg.cluster.name == ClusterKind.torchrun:
        from launcher.runners.torchrun_nodes import TorchrunNodesRunner

        return TorchrunNodesRunner()
    if cfg.parallel.world > 1:
        from launcher.runners.torchrun import TorchrunRunner

        return TorchrunRunner()
    from launcher.runners.inprocess import InProcessRunner

    return InProcessRunner()
