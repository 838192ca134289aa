"""Pipeline parallelism (parallel.pp > 1): which blocks each stage holds, what each schedule needs
of the accumulation, and what pp composes with today; checked before anything starts, one
ConfigError each, naming the keys, with a Fix that works as printed (docs/parallelism.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.config.ac import AcPolicy
from launcher.config.batch import divisors
from launcher.config.engine import EngineName, Offload
from launcher.config.model import ModelConfig
from launcher.config.train import Precision
from launcher.errors import ConfigError

if TYPE_CHECKING:
    from launcher.config.root import RootConfig

GPIPE, ONE_F_ONE_B, INTERLEAVED = "gpipe", "1f1b", "interleaved_1f1b"
SCHEDULES = (GPIPE, ONE_F_ONE_B, INTERLEAVED)
"""parallel.pp_schedule's values (torch.distributed.pipelining's ScheduleGPipe, Schedule1F1B,
ScheduleInterleaved1F1B)."""
NOT_YET = "parallel.pp=1"
"""The fix that always works: no pipeline."""


def stages_per_rank(schedule: str) -> int:
    """Virtual stages per pipeline rank: 2 for the interleaved schedule, else 1."""
    return 2 if schedule == INTERLEAVED else 1


def stage_blocks(n_blocks: int, stages: int) -> list[range]:
    """The blocks of each stage, in order: equal runs of consecutive blocks (the embedding rides
    on the first stage, the final norm and the head on the last). stages divides n_blocks (the
    config checks it first)."""
    per = n_blocks // stages
    return [range(s * per, (s + 1) * per) for s in range(stages)]


def stage_ranks(pp: int, schedule: str) -> list[int]:
    """The pipeline rank of each stage: loop style, stage s on rank s % pp (torch's default for
    the one- and the interleaved schedules)."""
    return [s % pp for s in range(pp * stages_per_rank(schedule))]


def describe_stages(pp: int, schedule: str, n_blocks: int) -> list[dict[str, object]]:
    """plan.json's `pipeline.stages`: per stage its pp rank and blocks."""
    stages = pp * stages_per_rank(schedule)
    ranks = stage_ranks(pp, schedule)
    return [
        {
            "stage": s,
            "pp_rank": ranks[s],
            "blocks": list(blocks),
            "embedding": s == 0,
            "head": s == stages - 1,
        }
        for s, blocks in enumerate(stage_blocks(n_blocks, stages))
    ]


def accumulation_ok(schedule: str, pp: int, grad_accum: int) -> bool:
    """The schedule's rule for its micro-batches (= batch.grad_accum): 1F1B's warm-up needs at
    least pp of them, the interleaved rounds a multiple of pp; GPipe runs any number."""
    if schedule == ONE_F_ONE_B:
        return grad_accum >= pp
    if schedule == INTERLEAVED:
        return grad_accum % pp == 0
    return True


def check_pipeline(cfg: RootConfig) -> None:
    """parallel.pp > 1: the model, the layers, the schedule's accumulation and the features it
    composes with. pp=1 passes untouched."""
    parallel = cfg.parallel
    if parallel.pp_schedule not in SCHEDULES:
        raise ConfigError(
            "parallel.pp_schedule",
            f"{parallel.pp_schedule!r} is not a pipeline schedule.",
            f"set parallel.pp_schedule to one of {', '.join(SCHEDULES)}.",
        )
    pp = parallel.pp
    if pp == 1:
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
    _check_accumulation(cfg)
    _check_features(cfg)


def _check_layers(cfg: RootConfig, model: ModelConfig) -> None:
    pp, schedule = cfg.parallel.pp, cfg.parallel.pp_schedule
    stages = pp * stages_per_rank(schedule)
    if model.n_layer % stages == 0:
        return
    per_rank = stages_per_rank(schedule)
    fits = [d // per_rank for d in divisors(model.n_layer) if d % per_rank == 0 and d > per_rank]
    below = [p for p in fits if p < pp]
    fix = f"set parallel.pp={below[-1]}" if below else f"set {NOT_YET}"
    many = f" ({per_rank} per rank)" if per_rank > 1 else ""
    raise ConfigError(
        ["parallel.pp", "model.n_layer"],
        f"parallel.pp={pp} needs {stages} stages{many} of whole blocks, and the model's "
        f"n_layer={model.n_layer} blocks do not split into {stages} equal stages.",
        f"{fix}, or a model.n_layer that is a multiple of {stages} "
        f"(e.g. model.n_layer={-(-model.n_layer // stages) * stages}).",
    )


def _check_accumulation(cfg: RootConfig) -> None:
    """The schedule's micro-batches are the accumulation's: batch.grad_accum must suit it."""
    pp, schedule = cfg.parallel.pp, cfg.parallel.pp_schedule
    if cfg.batch.auto:
        return  # refused with the features below
    split = cfg.split()
    if accumulation_ok(schedule, pp, split.grad_accum):
        return
    per_rank = split.global_size // split.dp
    good = [k for k in divisors(per_rank) if accumulation_ok(schedule, pp, k)]
    micro_set = " batch.micro_size=null" if cfg.batch.micro is not None else ""
    if good:
        fix = f"set batch.grad_accum={good[0]}{micro_set}"
    else:
        fix = (
            f"set batch.global_size={split.dp * pp} batch.grad_accum={pp}{micro_set} (or a "
            f"multiple of {split.dp * pp} sequences)"
        )
    need = "at least pp" if schedule == ONE_F_ONE_B else "a multiple of pp"
    raise ConfigError(
        ["batch.grad_accum", "parallel.pp", "parallel.pp_schedule"],
        f"the {schedule} schedule streams the accumulation's micro-batches through {pp} stages "
        f"and needs {need} of them per step; batch.grad_accum is {split.grad_accum}.",
        f"{fix}, or parallel.pp_schedule=gpipe (any number).",
    )


def _check_features(cfg: RootConfig) -> None:
    """Features not composed with pipeline parallelism yet: refused, naming the key."""
    pp = cfg.parallel.pp
    refused = [
        ((cfg.parallel.replicate or 1) > 1, "parallel.replicate", "drop parallel.replicate"),
        (cfg.parallel.elastic, "parallel.min_nodes", "drop parallel.min_nodes"),
        (cfg.engine.offload != Offload.none, "engine.offload", "set engine.offload=none"),
        (cfg.batch.auto, "batch.micro_size=auto", "set batch.micro_size to a number"),
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


def bubble(pp: int, grad_accum: int, schedule: str) -> float:
    """The share of a step a stage idles in the pipeline's fill and drain (the standard analysis):
    (pp - 1) / (v x grad_accum + pp - 1), v the stages per rank."""
    return (pp - 1) / (stages_per_rank(schedule) * grad_accum + pp - 1)


def pipeline_lines(pp: int, schedule: str, n_blocks: int, grad_accum: int) -> list[str]:
    """`launch plan`'s lines for the pipeline (none at pp=1): the schedule, its bubble, and which
    blocks each stage holds."""
    if pp == 1:
        return []
    lines = [
        f"pipeline    pp {pp}, schedule {schedule}, {grad_accum} micro-batch(es) per step "
        f"(batch.grad_accum), bubble {bubble(pp, grad_accum, schedule):.0%}"
    ]
    for stage in describe_stages(pp, schedule, n_blocks):
        blocks = stage["blocks"]
        assert isinstance(blocks, list)
        parts = [f"blocks {blocks[0]}-{blocks[-1]}" if len(blocks) > 1 else f"block {blocks[0]}"]
        if stage["embedding"]:
            parts.insert(0, "embedding")
        if stage["head"]:
            parts.append("final norm and head")
        lines.append(f"  stage {stage['stage']} on pp rank {stage['pp_rank']}: {', '.join(parts)}")
    return lines


def held_micro_batches(schedule: str, pp: int, grad_accum: int) -> float:
    """Micro-batches whose activations the busiest pipeline rank holds at once, in units of one
    micro-batch through that rank's blocks: GPipe all of them; 1F1B the first stage's warm-up,
    pp; interleaved (v = 2 virtual stages) its warm-up of (v - 1) pp + 2 (pp - 1) virtual
    micro-batches plus one in flight (torch's _get_warmup_ops), each 1/v of the rank's blocks."""
    if schedule == GPIPE:
        return float(grad_accum)
    if schedule == ONE_F_ONE_B:
        return float(min(grad_accum, pp))
    v = stages_per_rank(schedule)
    return min(grad_accum * v, (v - 1) * pp + 2 * (pp - 1) + 2) / v
