"""Config -> Plan: the world, the batch arithmetic, tokens per step, sizes and how it will run.

The plan is complete: the command, the environment the runner adds and the text of every file it
writes besides config.yaml and plan.json. `launch plan` prints it; `launch train` writes the same
files and hands the same plan to its runner.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from launcher.config.load import to_plain
from launcher.config.root import RootConfig
from launcher.engines import engine_spec
from launcher.models import GPT
from launcher.recompute.estimate import estimate_all
from launcher.secrets import redactor_for


def count_parameters(cfg: RootConfig) -> int:
    """Exact parameter count, from a model built on the meta device (no memory, no time)."""
    with torch.device("meta"):
        return GPT(cfg.model).num_params()


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
            f"world       {self.world_size} rank(s) on {self.nodes} node(s), {self.ranks_per_node} per node",
            f"batch       {self.global_size} sequences/step = dp {self.world_size} x grad_accum {self.grad_accum} x micro {self.micro_size}",
            f"tokens/step {self.tokens_per_step:,} positions ({self.global_size} x seq_len {self.seq_len})",
            f"model       {self.parameters:,} parameters, {self.precision}",
            f"engine      {self.engine}{stage}, recompute: {self.ac}",
            f"memory est. params {_mib(self.memory_estimate['parameters'])}, optimizer {_mib(self.memory_estimate['optimizer'])}, activations/micro-batch {_mib(self.memory_estimate['activations'])} (peak {_mib(self.memory_estimate['activations_peak'])})",
            "recompute   " + _recompute_table(self.activation_estimates, self.ac),
            f"runner      {self.runner}",
        ]
        if self.command:
            lines.append("command     " + " ".join(self.command))
        if self.env:
            lines.append("env         " + " ".join(f"{k}={v}" for k, v in sorted(self.env.items())))
        return "\n".join(lines)


def _recompute_table(estimates: dict[str, dict[str, float]], chosen: str) -> str:
    """One entry per policy: activation MiB kept / peak per micro-batch, and the FLOPs ratio."""
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
    chosen = estimates[cfg.ac.policy.value]
    return Plan(
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
            "activations": chosen.activation_bytes,
            "activations_peak": chosen.activation_peak_bytes,
        },
        runner=runner.name,
        command=command,
        env=runner.environment(cfg),
        files=files,
        activation_estimates={name: e.to_json() for name, e in estimates.items()},
    )
