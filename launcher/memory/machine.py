"""The memory the ranks train in, as the plan's default budget: a local GPU's memory, or on CPU
this machine's RAM (or a SLURM node's cluster.mem) shared by the ranks on it. A plan over it is
refused before launch (issue 17: a global batch of 10**12 once planned 423 billion MiB of
activations without a word)."""

from __future__ import annotations

import re
import shutil
import subprocess

import psutil
import torch

from launcher.config.root import RootConfig
from launcher.memory.budget import Budget

_SLURM_MEM = re.compile(r"^(\d+)([KMGT]?)$")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "": 2**20}  # sbatch --mem: MiB by default


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


def machine_memory(cfg: RootConfig, runner: str) -> tuple[int, int, str] | None:
    """(bytes, ranks sharing them, what they are) of the memory the ranks train in; None when
    it is not known here (a SLURM job on GPUs, or without cluster.mem)."""
    per_node = cfg.parallel.ranks_per_node
    if runner == "slurm":
        match = _SLURM_MEM.match(cfg.cluster.mem or "")
        if cfg.cluster.gpus_per_node or match is None or int(match.group(1)) == 0:
            return None
        mem = int(match.group(1)) * _UNITS[match.group(2)]
        return mem, per_node, f"cluster.mem={cfg.cluster.mem} per node"
    gpu = cfg.train.device == "cuda" or (cfg.train.device == "auto" and torch.cuda.is_available())
    if gpu:
        total = _gpu_memory_bytes()
        return None if total is None else (total, 1, "the memory of one GPU")
    return int(psutil.virtual_memory().total), per_node, "this machine's RAM"


def machine_budget(cfg: RootConfig, runner: str) -> Budget | None:
    """A rank's share of the machine's memory as a budget; None when it is not known here."""
    machine = machine_memory(cfg, runner)
    if machine is None:
        return None
    capacity, sharing, what = machine
    shared = f" shared by {sharing} ranks" if sharing > 1 else ""
    return Budget(capacity // sharing, f"{what}{shared}")
