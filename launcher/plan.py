"""Config -> Plan: the world, the batch arithmetic, tokens per step, sizes and how it will run.

The plan is complete: the command, the environment the runner adds and the text of every file it
writes besides config.yaml and plan.json. `launch plan` prints it; `launch train` writes the same
files and hands the same plan to its runner.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil
import torch

from launcher.config.load import to_plain
from launcher.config.root import RootConfig
from launcher.engines import engine_spec
from launcher.errors import ConfigError
from launcher.models.probe import inspect_model
from launcher.recompute.estimate import estimate_all
from launcher.secrets import redactor_for


def count_parameters(cfg: RootConfig) -> int:
    """Exact parameter count of the model actually built, on the meta device (no memory, no
    time). Also every model check of the plan (launcher/models/probe.py): blocks where a policy
    or FSDP needs them, and a user model's probe forward."""
    return inspect_model(cfg).parameters


@dataclass
class Plan:
    """What a run will do; written to plan.json and printed by `launch plan`."""

    world_size: int
    nodes: int
    ranks_per_node: int
    global_size: int
    micro_size: int
    grad_accum: int
    seq_len: int
    tokens_per_step: int
    engine: str
    zero_stage: int | None
    ac: str
    precision: str
    parameters: int
    memory_estimate: dict[str, int]
    runner: str
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables the runner adds for the command."""
    files: dict[str, str] = field(default_factory=dict)
    """Files the engine and the runner need in the run directory: name -> the exact text written
    (credentials redacted). plan.json lists their names."""
    activation_estimates: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per recompute policy: activation_bytes, activation_peak_bytes, recompute_flops_ratio."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["files"] = list(self.files)
        return data

    def describe(self) -> str:
        stage = f" (ZeRO stage {self.zero_stage})" if self.zero_stage is not None else ""
        lines = [
            f"world       {self.world_size} rank(s) on {self.nodes} node(s), {self.ranks_per_node} "
            "per node",
            f"batch       {self.global_size} sequences/step = dp {self.world_size} x grad_accum "
            f"{self.grad_accum} x micro {self.micro_size}",
            f"tokens/step {self.tokens_per_step:,} positions ({self.global_size} x seq_len "
            f"{self.seq_len})",
            f"model       {self.parameters:,} parameters, {self.precision}",
            f"engine      {self.engine}{stage}, recompute: {self.ac}",
            f"memory est. params {_mib(self.memory_estimate['parameters'])}, optimizer "
            f"{_mib(self.memory_estimate['optimizer'])}, activations/micro-batch "
            f"{_activations(self.memory_estimate, self.activation_estimates)}",
            "recompute   " + _recompute_table(self.activation_estimates, self.ac),
            f"runner      {self.runner}",
        ]
        if self.command:
            lines.append("command     " + " ".join(self.command))
        if self.env:
            lines.append("env         " + " ".join(f"{k}={v}" for k, v in sorted(self.env.items())))
        return "\n".join(lines)


def _activations(memory: dict[str, int], estimates: dict[str, dict[str, float]]) -> str:
    if not estimates:
        return "not estimated (a user model: summary.json has the measured figures)"
    return f"{_mib(memory['activations'])} (peak {_mib(memory['activations_peak'])})"


def _recompute_table(estimates: dict[str, dict[str, float]], chosen: str) -> str:
    """One entry per policy: activation MiB kept / peak per micro-batch, and the FLOPs ratio."""
    if not estimates:
        return "not estimated for a user model (measured per run in summary.json)"
    cells = [
        f"{'*' if name == chosen else ''}{name} {e['activation_bytes'] / 2**20:,.1f}/"
        f"{e['activation_peak_bytes'] / 2**20:,.1f} MiB x{e['recompute_flops_ratio']:.2f}"
        for name, e in estimates.items()
    ]
    return "est. kept/peak activations, FLOPs: " + ", ".join(cells)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


class RunnerPart(Protocol):
    """What the runner (launcher/runners/, chosen by `runner_for`) adds to the plan."""

    @property
    def name(self) -> str: ...

    def command(self, cfg: RootConfig, run_dir: Path) -> list[str]: ...

    def environment(self, cfg: RootConfig) -> dict[str, str]: ...

    def files(self, cfg: RootConfig, run_dir: Path) -> dict[str, str]: ...


def build_plan(cfg: RootConfig, run_dir: Path, runner: RunnerPart) -> Plan:
    """The complete plan for a run in `run_dir`; a bad value raises before anything is written."""
    command = runner.command(cfg, run_dir)
    runner_files = runner.files(cfg, run_dir)
    engine = engine_spec(cfg.engine.name)
    engine_files = engine.extra_files(cfg)  # generated (and checked) here, once
    secrets = redactor_for(to_plain(cfg))
    files = {name: secrets.text(text) for name, text in {**engine_files, **runner_files}.items()}
    split = cfg.split()
    params = count_parameters(cfg)
    estimates = estimate_all(cfg, split.micro_size)
    chosen = estimates.get(cfg.ac.policy.value)  # None: a user model's are not estimated
    plan = Plan(
        world_size=split.dp,
        nodes=cfg.parallel.nodes,
        ranks_per_node=cfg.parallel.ranks_per_node,
        global_size=split.global_size,
        micro_size=split.micro_size,
        grad_accum=split.grad_accum,
        seq_len=cfg.model.seq_len,
        tokens_per_step=split.global_size * cfg.model.seq_len,
        engine=cfg.engine.name.value,
        zero_stage=engine.zero_stage(cfg),
        ac=cfg.ac.policy.value,
        precision=cfg.train.precision.value,
        parameters=params,
        memory_estimate={
            **engine.state_bytes(cfg, params),  # per rank: what the engine shards over dp
            "activations": chosen.activation_bytes if chosen else 0,
            "activations_peak": chosen.activation_peak_bytes if chosen else 0,
        },
        runner=runner.name,
        command=command,
        env=runner.environment(cfg),
        files=files,
        activation_estimates={name: e.to_json() for name, e in estimates.items()},
    )
    check_memory(plan, cfg)
    return plan


# --- does it fit the machine ---------------------------------------------------------------------

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


def check_memory(plan: Plan, cfg: RootConfig) -> None:
    """Refuse a plan whose memory estimate (model state plus the activation peak of one
    micro-batch, per rank) exceeds the memory its ranks have; the estimate leaves out the
    framework's own overhead, so a plan that passes may still not fit."""
    machine = machine_memory(cfg, plan.runner)
    if machine is None:
        return
    capacity, sharing, what = machine
    est = plan.memory_estimate
    state = sum(est.get(k, 0) for k in ("parameters", "gradients", "optimizer"))
    per_rank = state + est["activations_peak"]
    if per_rank * sharing <= capacity:
        return
    per_sequence = est["activations_peak"] / plan.micro_size
    fits = int((capacity // sharing - state) // per_sequence) if per_sequence else 0
    full = plan.activation_estimates.get("full", {}).get("activation_peak_bytes")
    ranks = f" x {sharing} ranks" if sharing > 1 else ""
    fixes = []
    if 0 < fits < plan.micro_size:
        fixes.append(
            f"fewer sequences per micro-batch (batch.micro_size={_fit(fits)} or less; "
            f"batch.grad_accum makes up the global batch of {plan.global_size:,})"
        )
    if full is not None and plan.ac != "full":
        fixes.append(f"recompute activations (ac=full: peak {_gib(full)} per micro-batch)")
    fixes.append(
        "shard the model state over more ranks (engine=fsdp or engine=deepspeed "
        "engine.zero_stage=3 with a larger parallel.dp)"
    )
    raise ConfigError(
        ["batch.micro_size", "ac", "engine.zero_stage", "parallel.dp"],
        f"the plan needs about {_gib(per_rank)} per rank{ranks} (model state {_gib(state)}, "
        f"activations of a micro-batch of {plan.micro_size:,} sequences "
        f"{_gib(est['activations_peak'])}), "
        f"more than {what} ({_gib(capacity)}).",
        "; ".join(fixes) + ".",
    )


def _fit(n: int) -> int:
    """The largest power of two <= n (a micro size that divides the usual batch sizes)."""
    return 1 << (n.bit_length() - 1)


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else _mib(int(n))
