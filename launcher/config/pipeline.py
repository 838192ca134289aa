"""Pipeline parallelism (parallel.pp > 1): the stage keys (parallel.pp_stages_per_rank,
parallel.pp_split; the layout they give is launcher/config/stages.py), what each schedule needs
of the accumulation, and what pp composes with today; checked before anything starts, one
ConfigError each, naming the keys, with a Fix that works as printed (docs/parallelism.md). And
`launch plan`'s pipeline lines."""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING, Any

from launcher.config.ac import AcPolicy
from launcher.config.batch import divisors
from launcher.config.checks import require_positive
from launcher.config.engine import EngineName, Offload
from launcher.config.model import ModelConfig
from launcher.config.stages import INTERLEAVED, even_starts, stages_per_rank
from launcher.config.train import Precision
from launcher.errors import ConfigError

if TYPE_CHECKING:
    from launcher.config.root import RootConfig

GPIPE, ONE_F_ONE_B = "gpipe", "1f1b"
SCHEDULES = (GPIPE, ONE_F_ONE_B, INTERLEAVED)
"""parallel.pp_schedule's values (torch.distributed.pipelining's ScheduleGPipe, Schedule1F1B,
ScheduleInterleaved1F1B)."""
NOT_YET = "parallel.pp=1"
"""The fix that always works: no pipeline."""
BALANCED = "parallel.pp_split=null (balanced by the memory plan)"


def accumulation_ok(schedule: str, pp: int, grad_accum: int) -> bool:
    """The schedule's rule for its micro-batches (= batch.grad_accum): 1F1B's warm-up needs at
    least pp of them, the interleaved rounds a multiple of pp; GPipe runs any number."""
    if schedule == ONE_F_ONE_B:
        return grad_accum >= pp
    if schedule == INTERLEAVED:
        return grad_accum % pp == 0
    return True


def check_pipeline(cfg: RootConfig) -> None:
    """parallel.pp > 1: the model, the stages, the schedule's accumulation and the features it
    composes with. pp=1 passes with its stage keys at their defaults."""
    parallel = cfg.parallel
    if parallel.pp_schedule not in SCHEDULES:
        raise ConfigError(
            "parallel.pp_schedule",
            f"{parallel.pp_schedule!r} is not a pipeline schedule.",
            f"set parallel.pp_schedule to one of {', '.join(SCHEDULES)}.",
        )
    _check_stages_per_rank(cfg)
    pp = parallel.pp
    if pp == 1:
        if parallel.pp_split:
            raise ConfigError(
                ["parallel.pp_split", "parallel.pp"],
                f"parallel.pp_split={_show(parallel.pp_split)} names where pipeline stages "
                "start, and parallel.pp=1 runs no pipeline.",
                "set parallel.pp_split=null, or a parallel.pp above 1.",
            )
        return
    if cfg.engine.name == EngineName.deepspeed:
        raise ConfigError(
            ["parallel.pp", "engine"],
            f"parallel.pp={pp}: pipeline stages compose with engine=fsdp and engine=ddp; "
            "DeepSpeed's own pipeline engine is not wired in (nor certified token-exact).",
            f"add engine=fsdp (FSDP2 over each stage's data-parallel ranks), or set {NOT_YET}.",
        )
    model = cfg.model
    if not isinstance(model, ModelConfig):
        raise ConfigError(
            ["parallel.pp", "model"],
            f"parallel.pp={pp}: pipeline stages are cut from the built-in GPT only; a user or "
            "Hugging Face model has no stage forward yet.",
            f"set {NOT_YET}, or train the built-in GPT (model=tiny, small or gpt2).",
        )
    _check_layers(cfg, model)
    _check_split(cfg, model)
    _check_accumulation(cfg)
    _check_features(cfg)


def _show(split: list[int]) -> str:
    """A list as the command line writes it (one shell word)."""
    return "[" + ",".join(str(i) for i in split) + "]"


def _check_stages_per_rank(cfg: RootConfig) -> None:
    """parallel.pp_stages_per_rank: several only for the interleaved schedule, which needs two
    at least (with one it is 1F1B)."""
    parallel = cfg.parallel
    asked = parallel.pp_stages_per_rank
    if asked is None:
        return
    require_positive("parallel.pp_stages_per_rank", asked)
    schedule = parallel.pp_schedule
    if schedule != INTERLEAVED and asked != 1:
        raise ConfigError(
            ["parallel.pp_stages_per_rank", "parallel.pp_schedule"],
            f"parallel.pp_stages_per_rank={asked}: the {schedule} schedule runs one stage per "
            "pipeline rank; virtual stages are the interleaved schedule's.",
            f"set parallel.pp_stages_per_rank=1, or parallel.pp_schedule={INTERLEAVED}.",
        )
    if schedule == INTERLEAVED and asked < 2:
        raise ConfigError(
            ["parallel.pp_stages_per_rank", "parallel.pp_schedule"],
            f"parallel.pp_stages_per_rank={asked}: the {INTERLEAVED} schedule interleaves "
            "several stages per rank (with one it is 1f1b).",
            "set parallel.pp_stages_per_rank=2, or parallel.pp_schedule=1f1b.",
        )


def _check_layers(cfg: RootConfig, model: ModelConfig) -> None:
    """Every stage holds one block at least: pp x stages per rank <= model.n_layer."""
    parallel = cfg.parallel
    pp = parallel.pp
    per_rank = stages_per_rank(parallel.pp_schedule, parallel.pp_stages_per_rank)
    stages = pp * per_rank
    if model.n_layer >= stages:
        return
    below = [p for p in range(2, pp) if p * per_rank <= model.n_layer]
    fix = f"set parallel.pp={below[-1]}" if below else f"set {NOT_YET}"
    many = f" ({per_rank} per rank)" if per_rank > 1 else ""
    raise ConfigError(
        ["parallel.pp", "model.n_layer"],
        f"parallel.pp={pp} needs {stages} stages{many} of one block at least, and the model "
        f"has n_layer={model.n_layer} blocks.",
        f"{fix}, or a model.n_layer of at least {stages} (e.g. model.n_layer={stages}).",
    )


def _check_split(cfg: RootConfig, model: ModelConfig) -> None:
    """parallel.pp_split: one start per stage after the first, increasing, inside the model, so
    that no stage is empty."""
    parallel = cfg.parallel
    split = parallel.pp_split
    if split is None:
        return
    per_rank = stages_per_rank(parallel.pp_schedule, parallel.pp_stages_per_rank)
    stages, n = parallel.pp * per_rank, model.n_layer
    problem = None
    if len(split) != stages - 1:
        problem = f"has {len(split)} start(s); {stages} stages need {stages - 1}"
    elif any(not 1 <= i <= n - 1 for i in split):
        problem = f"names a block outside 1..{n - 1} (stage 0 starts at block 0)"
    elif any(b <= a for a, b in pairwise(split)):
        problem = "is not strictly increasing, so a stage would hold no block"
    if problem is None:
        return
    many = f" ({per_rank} per rank)" if per_rank > 1 else ""
    raise ConfigError(
        ["parallel.pp_split", "parallel.pp"],
        f"parallel.pp_split={_show(split)} {problem}: the blocks where stages 1..{stages - 1} "
        f"start, for {stages} stages{many} over model.n_layer={n} blocks.",
        f"set parallel.pp_split={_show(even_starts(n, stages))} (the even split), or {BALANCED}.",
    )


def _check_accumulation(cfg: RootConfig) -> None:
    """The schedule's micro-batches are the accumulation's: batch.grad_accum must suit it."""
    pp, schedule = cfg.parallel.pp, cfg.parallel.pp_schedule
    split = cfg.split()
    per_rank = split.global_size // split.dp
    good = [k for k in divisors(per_rank) if accumulation_ok(schedule, pp, k)]
    if cfg.batch.auto and good:
        return  # the plan chooses among these (launcher/memory/auto.py)
    if not cfg.batch.auto and accumulation_ok(schedule, pp, split.grad_accum):
        return
    micro_set = " batch.micro_size=null" if cfg.batch.micro is not None or cfg.batch.auto else ""
    if good:
        fix = f"set batch.grad_accum={good[0]}{micro_set}"
    else:
        fix = (
            f"set batch.global_size={split.dp * pp} batch.grad_accum={pp}{micro_set} (or a "
            f"multiple of {split.dp * pp} sequences)"
        )
    need = "at least pp" if schedule == ONE_F_ONE_B else "a multiple of pp"
    have = (
        f"batch.micro_size=auto finds none: a rank's {per_rank} sequence(s) per step are at most "
        f"{per_rank} micro-batch(es)"
        if cfg.batch.auto
        else f"batch.grad_accum is {split.grad_accum}"
    )
    raise ConfigError(
        ["batch.grad_accum", "parallel.pp", "parallel.pp_schedule"],
        f"the {schedule} schedule streams the accumulation's micro-batches through {pp} stages "
        f"and needs {need} of them per step; {have}.",
        f"{fix}, or parallel.pp_schedule=gpipe (any number).",
    )


def _check_features(cfg: RootConfig) -> None:
    """Features not composed with pipeline parallelism yet: refused, naming the key."""
    pp = cfg.parallel.pp
    refused = [
        ((cfg.parallel.replicate or 1) > 1, "parallel.replicate", "drop parallel.replicate"),
        (cfg.parallel.elastic, "parallel.min_nodes", "drop parallel.min_nodes"),
        (cfg.engine.offload != Offload.none, "engine.offload", "set engine.offload=none"),
        (cfg.ac.policy == AcPolicy.auto, "ac=auto", "use ac=none or ac=full"),
        (cfg.ac.policy == AcPolicy.selective, "ac=selective", "use ac=full (or every_n, sqrt)"),
        (cfg.adapter.enabled, "adapter", "set adapter=none"),
        (cfg.data.document_masks, "data.packing", "set data.packing=false"),
        (cfg.train.compile, "train.compile", "set train.compile=false"),
        (cfg.train.precision != Precision.fp32, "train.precision", "set train.precision=fp32"),
        (cfg.checkpoint.async_, "checkpoint.async", "set checkpoint.async=false"),
        (bool(cfg.eval.harness.every), "eval.harness.every", "set eval.harness.every=0"),
        (cfg.debug.broken_tp_count, "debug.broken_tp_count", "drop debug.broken_tp_count"),
    ]
    for on, key, fix in refused:
        if on:
            raise ConfigError(
                [key.split("=")[0], "parallel.pp"],
                f"{key} is not composed with pipeline parallelism (parallel.pp={pp}) yet.",
                f"{fix}, or set {NOT_YET}.",
            )


def bubble(pp: int, grad_accum: int, per_rank: int = 1) -> float:
    """The share of a step a stage idles in the pipeline's fill and drain (the standard analysis):
    (pp - 1) / (v x grad_accum + pp - 1), v the stages per rank."""
    return (pp - 1) / (per_rank * grad_accum + pp - 1)


def pipeline_lines(pipeline: dict[str, Any], grad_accum: int) -> list[str]:
    """`launch plan`'s lines for plan.json's `pipeline`: the schedule, its bubble, the blocks of
    each stage, and per pipeline rank what the memory plan holds."""
    stages, ranks = pipeline["stages"], pipeline.get("ranks", [])
    pp = len({s["pp_rank"] for s in stages})
    virtual = f", {len(stages) // pp} stages per rank" if len(stages) > pp else ""
    lines = [
        f"pipeline    pp {pp}, schedule {pipeline['schedule']}{virtual}, {grad_accum} "
        f"micro-batch(es) per step (batch.grad_accum), bubble {pipeline['bubble']:.0%}"
    ]
    for stage in stages:
        blocks = stage["blocks"]
        parts = [f"blocks {blocks[0]}-{blocks[-1]}" if len(blocks) > 1 else f"block {blocks[0]}"]
        if stage["embedding"]:
            parts.insert(0, "embedding")
        if stage["head"]:
            parts.append("final norm and head")
        saved = stage.get("activation_bytes")
        each = f" ({saved / 2**20:,.2f} MiB saved per micro-batch)" if saved is not None else ""
        where = f"  stage {stage['stage']} on pp rank {stage['pp_rank']}"
        lines.append(f"{where}: {', '.join(parts)}{each}")
    for rank in ranks:
        peak = " (the plan's peak)" if rank.get("peak") else ""
        lines.append(
            f"  pp rank {rank['pp_rank']}: {rank['parameters']:,} parameters, activations held "
            f"{rank['activation_bytes'] / 2**20:,.2f} MiB ({rank['held_micro_batches']:g} "
            f"micro-batch(es) at its peak), planned peak {rank['planned_peak_bytes'] / 2**20:,.1f} "
            f"MiB{peak}"
        )
    return lines
