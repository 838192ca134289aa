"""What the runners on this machine (in-process, torchrun) check before starting: its devices."""

from __future__ import annotations

import os

import torch

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


class LocalRunner(Runner):
    """A runner whose ranks train on this machine."""

    def check_environment(self, cfg: RootConfig) -> str:
        per_node = cfg.parallel.ranks_per_node
        wants_gpu = cfg.train.device == "cuda" or (
            cfg.train.device == "auto" and torch.cuda.is_available()
        )
        if wants_gpu:
            gpus = torch.cuda.device_count()
            if per_node > gpus:
                raise ConfigError(
                    "parallel.dp",
                    f"{per_node} ranks on this node but only {gpus} GPU(s).",
                    f"set parallel.dp<={gpus}, or run on CPU with train.device=cpu.",
                )
        elif per_node > local_cpu_count():
            log.warning(
                f"parallel.dp={per_node} ranks on {local_cpu_count()} CPU core(s): they will share "
                "cores and run slower (fine for testing)."
            )
        return "cuda" if wants_gpu else "cpu"

    def machine_memory(self, cfg: RootConfig) -> MachineMemory | None:
        # The memory plan's module (and its fake-tensor probe): imported when a plan asks.
        from launcher.memory.machine import local_memory

        return local_memory(cfg)
