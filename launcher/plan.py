"""Config -> Plan: the world, the batch arithmetic, tokens per step, sizes and how it will run.

The plan is complete: the command, the environment the runner adds and the text of every file it
writes besides config.yaml and plan.json. `launch plan` prints it; `launch train` writes the same
files and hands the same plan to its runner.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.adapter import AdapterConfig
from launcher.config.load import to_plain
from launcher.config.pipeline import bubble, pipeline_lines
from launcher.config.root import RootConfig
from launcher.config.stages import stage_layout
from launcher.data.build import model_vocab
from launcher.data.vocab import vocab_source
from launcher.engines import engine_spec
from launcher.memory.auto import plan_and_choose
from launcher.memory.parts import MemoryPlan
from launcher.memory.table import beside_full, memory_table, mib
from launcher.models.probe import ModelInfo, inspect_model
from launcher.parallel.mesh import mesh_lines
from launcher.plan_memory import elastic_splits, memory_budget, plan_split
from launcher.recompute.estimate import estimate_all
from launcher.runners.base import Runner
from launcher.secrets import redactor_for


def model_info(cfg: RootConfig) -> ModelInfo:
    """Every model check of the plan (launcher/models/probe.py), with the engine's own reason to
    need the model's blocks."""
    return inspect_model(cfg, engine_spec(cfg.engine.name).needs_blocks(cfg))


def pipeline_plan(cfg: RootConfig, grad_accum: int, memory: MemoryPlan) -> dict[str, Any] | None:
    """plan.json's `pipeline` (pp > 1): the schedule, its stages per rank and split, its bubble,
    each stage's rank, blocks and saved activation bytes of one micro-batch, and each pipeline
    rank's memory plan (launcher/memory/stages.py)."""
    if cfg.parallel.pp == 1:
        return None
    layout = stage_layout(cfg)
    planned = memory.pipeline or {}
    stages = layout.describe()
    for stage, saved in zip(stages, planned.get("stage_activation_bytes", []), strict=False):
        stage["activation_bytes"] = saved
    return {
        "schedule": layout.schedule,
        "stages_per_rank": layout.per_rank,
        "split": list(layout.starts),
        "bubble": round(bubble(layout.pp, grad_accum, layout.per_rank), 4),
        "stages": stages,
        "ranks": planned.get("ranks", []),
    }


def count_parameters(cfg: RootConfig) -> int:
    """Exact parameter count of the model actually built, on the meta device (no memory, no
    time). Also every model check of the plan (launcher/models/probe.py): blocks where a policy
    or FSDP needs them, and a user model's probe forward."""
    return model_info(cfg).parameters


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
    engine_options: list[str]
    """The engine's options in words (hybrid sharding, offload): EngineSpec.describe."""
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
    planned_peak_bytes: int = 0
    """The memory plan's per-rank peak (the sum of memory_plan's parts)."""
    memory_plan: dict[str, Any] = field(default_factory=dict)
    """Per-rank parts, planned peak, activations' method (launcher/memory/parts.py)."""
    memory_budget_bytes: int | None = None
    memory_choice: dict[str, Any] | None = None
    """batch.micro_size=auto / ac=auto: what was requested, what was chosen and why."""
    vocab_size: int | None = None
    """Tokens the model embeds and predicts (None: a user model that does not say)."""
    vocab_from: str | None = None
    """Where vocab_size comes from: data.tokenizer (model.vocab_size=auto followed it),
    model.vocab_size, or model (a user model's own)."""
    elastic: list[dict[str, int]] = field(default_factory=list)
    """parallel.min_nodes < parallel.nodes: the split and planned peak on each allowed number of
    nodes, fewest first (empty when not elastic)."""
    full_finetune: dict[str, Any] | None = None
    """adapter=lora: the memory plan of a full fine-tune of the same model, split and engine
    (parts and planned peak), shown beside the adapter run's."""
    dp: int = 1
    """Data-parallel degree: distinct micro-batch streams."""
    tp: int = 1
    """Ranks of one tensor-parallel group (world = dp x tp)."""
    sequence_parallel: bool = False
    pp: int = 1
    """Pipeline stages' ranks (world = dp x tp x pp)."""
    pipeline: dict[str, Any] | None = None
    """pp > 1: the schedule, its bubble and each stage's pp rank and blocks; None otherwise."""
    config: RootConfig | None = None
    """The resolved config the ranks run (auto choices made); not in plan.json."""

    def to_json(self) -> dict[str, Any]:
        config, self.config = self.config, None
        try:
            data = asdict(self)
        finally:
            self.config = config
        data.pop("config")
        if data["full_finetune"] is None:  # adapter=none: nothing to set beside it
            data.pop("full_finetune")
        if data["pipeline"] is None:  # pp=1: no stages to name
            data.pop("pipeline")
        data["files"] = list(self.files)
        return data

    def describe(self) -> str:
        stage = f" (ZeRO stage {self.zero_stage})" if self.zero_stage is not None else ""
        lines = [
            f"world       {self.world_size} rank(s) on {self.nodes} node(s), {self.ranks_per_node} "
            "per node",
            *mesh_lines(self.dp, self.tp, self.sequence_parallel, self.pp),
            *(pipeline_lines(self.pipeline, self.grad_accum) if self.pipeline else []),
            f"batch       {self.global_size} sequences/step = dp {self.dp} x grad_accum "
            f"{self.grad_accum} x micro {self.micro_size}",
            f"tokens/step {self.tokens_per_step:,} positions ({self.global_size} x seq_len "
            f"{self.seq_len})",
            f"model       {self.parameters:,} parameters, {_vocab(self)}{self.precision}",
            f"engine      {self.engine}{stage}, recompute: {self.ac}",
            *(f"            {line}" for line in self.engine_options),
            "recompute   " + _recompute_table(self.activation_estimates, self.ac),
            *memory_table(self.memory_plan, self.memory_budget_bytes, self.memory_choice),
            *(
                f"elastic     on {e['nodes']} node(s): dp {e['dp']} x grad_accum "
                f"{e['grad_accum']} x micro {e['micro_size']}, planned peak "
                f"{mib(e['planned_peak_bytes'])} per rank"
                for e in self.elastic
            ),
            *(self.config.restarts_note() if self.config else []),
            *beside_full(self.memory_plan, self.full_finetune),
            f"runner      {self.runner}",
        ]
        if self.command:
            lines.append("command     " + shlex.join(self.command))  # as a shell reads it
        if self.env:
            lines.append("env         " + " ".join(f"{k}={v}" for k, v in sorted(self.env.items())))
        return "\n".join(lines)


def _vocab(plan: Plan) -> str:
    if plan.vocab_size is None:
        return ""
    said = " (the tokenizer's)" if plan.vocab_from == "data.tokenizer" else ""
    return f"vocabulary {plan.vocab_size:,}{said}, "


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


def build_plan(cfg: RootConfig, run_dir: Path, runner: Runner) -> Plan:
    """The complete plan for a run in `run_dir`; a bad value raises before anything is written.
    batch.micro_size=auto and ac=auto are chosen here: plan.config is the config to run."""
    info = model_info(cfg)
    budget = memory_budget(cfg, runner)
    cfg, choice = plan_split(cfg, info, runner, budget)
    auto = choice.variant is not None or choice.request != {
        "batch.micro_size": cfg.batch.micro_size,
        "ac": cfg.ac.policy.value,
    }
    elastic = elastic_splits(cfg, info, runner, budget)
    command = runner.command(cfg, run_dir)
    runner_files = runner.files(cfg, run_dir)
    engine = engine_spec(cfg.engine.name)
    engine_files = engine.extra_files(cfg)  # generated (and checked) here, once
    secrets = redactor_for(to_plain(cfg))
    files = {name: secrets.text(text) for name, text in {**engine_files, **runner_files}.items()}
    split = cfg.split()
    params = info.parameters
    vocab = model_vocab(cfg.model) or info.vocab
    estimates = estimate_all(cfg, split.micro_size)
    full = None
    if cfg.adapter.enabled:  # the same model, split and engine, every parameter trained
        whole = dataclasses.replace(cfg, adapter=AdapterConfig())
        full = plan_and_choose(whole, model_info(whole), None)[1].plan.to_json()
    return Plan(
        world_size=cfg.parallel.world,
        dp=split.dp,
        tp=cfg.parallel.tp,
        sequence_parallel=cfg.parallel.sequence_sharded,
        pp=cfg.parallel.pp,
        pipeline=pipeline_plan(cfg, split.grad_accum, choice.plan),
        nodes=cfg.parallel.nodes,
        ranks_per_node=cfg.parallel.ranks_per_node,
        global_size=split.global_size,
        micro_size=split.micro_size,
        grad_accum=split.grad_accum,
        seq_len=cfg.model.seq_len,
        tokens_per_step=split.global_size * cfg.model.seq_len,
        engine=cfg.engine.name.value,
        zero_stage=engine.zero_stage(cfg),
        engine_options=engine.describe(cfg),
        ac=cfg.ac.policy.value,
        precision=cfg.train.precision.value,
        parameters=params,
        memory_estimate={  # the plan's model state and activations, as plan.json had them
            "parameters": choice.plan.parts["parameters"],
            "gradients": choice.plan.parts["gradients"],
            "optimizer": choice.plan.parts["optimizer_state"],
            "activations": choice.plan.activation_bytes,
            "activations_peak": choice.plan.parts["activations"],
        },
        runner=runner.name,
        command=command,
        env=runner.environment(cfg),
        files=files,
        activation_estimates={name: e.to_json() for name, e in estimates.items()},
        planned_peak_bytes=choice.plan.peak,
        memory_plan=choice.plan.to_json(),
        memory_budget_bytes=budget.bytes if budget is not None else None,
        memory_choice=choice.to_json() if auto else None,
        vocab_size=vocab,
        vocab_from=vocab_source(cfg, vocab),
        elastic=elastic,
        full_finetune=full,
        config=cfg,
    )
