"""The memory the ranks train in, as the plan's default budget: a local GPU's memory, or on CPU
this machine's RAM shared by the ranks on it (a runner that trains elsewhere says its own:
`Runner.machine_memory`, a SLURM node's cluster.mem). A plan over it is refused before launch
(issue 17: a global batch of 10**12 once planned 423 billion MiB of activations without a word)."""

from __future__ import annotations

import shutil
import subprocess

import psutil
import torch

from launcher.config.root import RootConfig
from launcher.memory.budget import Budget

MachineMemory = tuple[int, int, str]
"""The memory the ranks train in: (bytes, ranks sharing them, what they are, in words)."""


def _gpu_memory_bytes() -> int | None:
    """The first GPU's memory, read without creating a CUDA context in `launch` (NVML, or
    nvidia-smi); None when neither answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)
    except Exception:  # not installed, or no driver: ask nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.split()
        return int(out[0]) * 2**20 if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def local_memory(cfg: RootConfig) -> MachineMemory | None:
    """The memory ranks on this machine train in: one GPU's, or this machine's RAM shared by the
    ranks; None when a GPU's is not known (neither NVML nor nvidia-smi answers)."""
    gpu = cfg.train.device == "cuda" or (cfg.train.device == "auto" and torch.cuda.is_available())
    if gpu:
        total = _gpu_memory_bytes()
        return None if total is None else (total, 1, "the memory of one GPU")
    return int(psutil.virtual_memory().total), cfg.parallel.ranks_per_node, "this machine's RAM"


def machine_budget(machine: MachineMemory | None) -> Budget | None:
    """A rank's share of the memory it trains in (the runner says where that is:
    `Runner.machine_memory`) as a budget; None when it is not known here."""
    if machine is None:
        return None
    capacity, sharing, what = machine
    shared = f" shared by {sharing} ranks" if sharing > 1 else ""
    return Budget(capacity // sharing, f"{what}{shared}")
