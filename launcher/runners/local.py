"""What the runners on this machine (in-process, torchrun) check before starting: its devices."""

from __future__ import annotations

import os

import torch

from launcher.config.batch import resolve_batch
from launcher.config.cluster import ClusterKind
from launcher.config.root import RootConfig
from launcher.errors import ConfigError
from launcher.host import local_cpu_count
from launcher.logs import get_logger
from launcher.memory.machine import MachineMemory
from launcher.runners.base import Runner

log = get_logger("launch")


def thread_environment(cfg: RootConfig) -> dict[str, str]:
    """Each rank's share of this machine's cores, as OMP_NUM_THREADS (unless the user set it):
    the ranks of one run share the cores instead of oversubscribing them (torchrun alone would
    pick 1 and warn), in-process and torchrun runs alike."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, local_cpu_count() // cfg.parallel.ranks_per_node))}


def warn_node_environment(cfg: RootConfig) -> None:
    """cluster=local in an environment that an engine set up for several nodes (Kubeflow
    Trainer's PET_* variables): training here alone is what the config says, but say so, and how
    to join the other nodes (torchrun itself never reads them here: launcher/runners/agent.py)."""
    found = sorted(name for name in os.environ if name.startswith("PET_"))
    if not found:
        return
    nodes = os.environ.get("PET_NNODES", "").split(":")[-1]
    hint = f" parallel.nodes={nodes}" if nodes.isdigit() and int(nodes) > 1 else ""
    per_node = os.environ.get("PET_NPROC_PER_NODE", "").strip()
    if hint and per_node.isdigit() and int(per_node) > 0:
        ranks = int(nodes) * int(per_node)  # dp x tp x pp in all
        model_ranks = cfg.parallel.tp * cfg.parallel.pp
        if ranks % model_ranks == 0:
            hint += f" parallel.dp={ranks // model_ranks}"
    log.warning(
        f"{', '.join(found)} are set (torchrun's multi-node variables, as Kubeflow Trainer sets "
        "them), but cluster=local trains on this machine alone and ignores them. Fix: to train "
        f"with the other nodes, run the same command on each with cluster=torchrun{hint} "
        "(docs/multinode.md)."
    )


def too_few_gpus(cfg: RootConfig, gpus: int) -> ConfigError:
    """The refusal of more ranks than this machine has GPUs, with fixes that run as written: the
    CPU here, a SLURM job with a GPU per rank, or (with some GPUs) the most ranks that fit and
    still split the global batch."""
    per_node = cfg.parallel.ranks_per_node
    elsewhere = (
        "train on the CPU here with train.device=cpu, or submit the job to GPUs with "
        f"cluster=slurm cluster.gpus_per_node={per_node}"
    )
    if gpus == 0:
        return ConfigError(
            ["train.device", "parallel.dp"],
            "train.device=cuda, but torch sees no GPU on this machine "
            "(torch.cuda.device_count() is 0).",
            elsewhere + ".",
        )
    model_ranks = cfg.parallel.tp * cfg.parallel.pp  # a dp rank's tp x pp ranks
    fewer = [dp for dp in range(gpus // model_ranks, 0, -1) if _splits(cfg, dp)]
    here = f"use the {gpus} GPU(s) here with parallel.dp={fewer[0]}, or " if fewer else ""
    return ConfigError(
        "parallel.dp",
        f"{per_node} ranks on this node but only {gpus} GPU(s).",
        here + elsewhere + ".",
    )


def _splits(cfg: RootConfig, dp: int) -> bool:
    """Whether the batch keys as given split over `dp` ranks."""
    try:
        resolve_batch(cfg.batch.global_size, cfg.batch.micro, cfg.batch.grad_accum, dp)
    except ConfigError:
        return False
    return True


class LocalRunner(Runner):
    """A runner whose ranks train on this machine."""

    def check_environment(self, cfg: RootConfig) -> str:
        if cfg.cluster.name == ClusterKind.local:
            warn_node_environment(cfg)
        per_node = cfg.parallel.ranks_per_node
        wants_gpu = cfg.train.device == "cuda" or (
            cfg.train.device == "auto" and torch.cuda.is_available()
        )
        if wants_gpu:
            gpus = torch.cuda.device_count()
            if per_node > gpus:
                raise too_few_gpus(cfg, gpus)
        elif per_node > local_cpu_count():
            ranks = " x ".join(
                f"parallel.{k}"
                for k in ("dp", "tp", "pp")
                if k == "dp" or getattr(cfg.parallel, k) > 1
            )
            log.warning(
                f"{ranks}={per_node} ranks on {local_cpu_count()} CPU core(s): they will share "
                "cores and run slower (fine for testing)."
            )
        return "cuda" if wants_gpu else "cpu"

    def machine_memory(self, cfg: RootConfig) -> MachineMemory | None:
        # The memory plan's module (and its fake-tensor probe): imported when a plan asks.
        from launcher.memory.machine import local_memory

        return local_memory(cfg)
