"""One rank from start to end: process group, model, data, engine, loop, evaluation, summary."""

from __future__ import annotations

import dataclasses
import random
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from launcher.checkpoint.checkpointer import Checkpointer
from launcher.config.model import blocks_path
from launcher.config.root import RootConfig
from launcher.data.build import Datasets, build_datasets, model_vocab, vocab_of
from launcher.data.mixture import MixtureDataset
from launcher.data.notes import announce_data
from launcher.distributed import DistContext, init_distributed, teardown_distributed
from launcher.engines import build_engine
from launcher.exit_codes import STOPPED_RESUMABLE
from launcher.harness.dispatch import Evaluations
from launcher.logs import get_logger, mark, setup_logging
from launcher.memory.auto import require_planned
from launcher.memory.peak import PeakMeter, planned_peak_bytes
from launcher.models.adapted import base_identity, build_trained_model
from launcher.models.documents import require_position_ids
from launcher.parallel.apply import apply_tensor_parallel
from launcher.parallel.mesh import with_mesh
from launcher.parallel.pipeline_split import split_for_rank, stage_parts
from launcher.recompute.measure import activation_report
from launcher.recompute.policies import apply_recompute
from launcher.rundir import clear_stopped, rank_error_file, read_stopped
from launcher.secrets import redact
from launcher.tracking.summary import RunEnd, RunShape, StoppedRun
from launcher.tracking.tracker import peak_memory_bytes, start_tracking
from launcher.training.evaluation import Evaluator
from launcher.training.loop import Trainer
from launcher.userpath import replace_own
from launcher.worker.compile import (
    EagerWhileMeasured,
    compile_blocks,
    compile_errors,
    compile_seconds,
    eager,
)
from launcher.worker.debug import debug_callbacks, loss_function, save_pause, stop_at_end
from launcher.worker.elastic import announce_restart, config_for_world
from launcher.worker.evaluate import exact_match
from launcher.worker.heartbeat import Heartbeat, Silent, start_heartbeat
from launcher.worker.stage_report import pipeline_summary
from launcher.worker.stop import (
    StopFlag,
    requeued_by_slurm,
    restart_attempt,
    stop_on_signals,
)

log = get_logger("worker")

BATCH_DEPENDENT = (nn.modules.batchnorm._BatchNorm, nn.LocalResponseNorm)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def warn_batch_dependent_layers(model: nn.Module, micro_size: int, global_size: int) -> bool:
    """BatchNorm-like layers normalise over the micro-batch, not the global batch: say so once."""
    if micro_size >= global_size:
        return False
    found = sorted({type(m).__name__ for m in model.modules() if isinstance(m, BATCH_DEPENDENT)})
    if not found:
        return False
    log.warning(
        f"the model has batch-dependent layers ({', '.join(found)}); their statistics come from "
        f"each micro-batch of {micro_size} sequences, not the global batch of {global_size}, so "
        "accumulation and data parallelism change what they compute. Use LayerNorm/GroupNorm, "
        "or SyncBatchNorm across ranks."
    )
    return True


def build_model(cfg: RootConfig, ctx: DistContext | None = None) -> nn.Module:
    """The model as the engine receives it, in torchtitan's order: the pipeline stage and tensor
    parallelism (ctx on a mesh), recompute, compile."""
    seed_everything(cfg.train.seed)  # the same initial weights on every rank and every split
    # The built-in GPT or the user's own, its initial weights, then the adapters (adapter=lora).
    model = build_trained_model(cfg)
    if ctx is not None and ctx.pp > 1:  # this rank's pipeline stages, the whole model's names
        model = split_for_rank(model, cfg, ctx.pp_rank)
    if ctx is not None:
        model = apply_tensor_parallel(cfg, model, ctx)
    for part in stage_parts(model):  # a pipeline rank's stages each run their blocks
        apply_recompute(part, cfg.ac, blocks_path(cfg.model))
    if cfg.train.compile:  # after the policy (it wraps blocks), before an engine shards them
        compile_blocks(model, cfg.ac, blocks_path(cfg.model))
    return model


def seed_rank(cfg: RootConfig, rank: int) -> None:
    """Dropout differs per rank; the data order never depends on this."""
    torch.manual_seed(cfg.train.seed + 1_000_003 * (rank + 1))


def build_data(cfg: RootConfig, model: nn.Module) -> Datasets:
    """The training (and held-out) data, tokenised for this model's vocabulary."""
    vocab = model_vocab(cfg.model) or vocab_of(model)
    return build_datasets(cfg.data, cfg.model.seq_len, cfg.train.seed, vocab)


def train_rank(
    cfg: RootConfig,
    run_dir: Path,
    ctx: DistContext,
    stop: StopFlag | None = None,
    heartbeat: Heartbeat | None = None,
) -> RunEnd:
    as_planned, cfg = cfg, config_for_world(cfg, ctx)  # elastic: the split for the ranks it got
    require_planned(cfg)  # batch.micro_size=auto / ac=auto are chosen by the plan, never here
    ctx = with_mesh(ctx, cfg.parallel.tp, cfg.replicas(), cfg.parallel.pp)  # the mesh, once
    split = cfg.split()
    model = build_model(cfg, ctx)
    if cfg.data.document_masks:  # before any engine wraps it
        require_position_ids(model)
    base = base_identity(cfg, model)  # adapter runs: what the checkpoints' adapters sit on
    warn_batch_dependent_layers(model, split.micro_size, split.global_size)
    engine = build_engine(cfg, model, ctx)
    seed_rank(cfg, ctx.rank)
    data = build_data(cfg, model)
    dataset = data.train
    if ctx.is_main:  # small data told the truth: packing, a global batch past an epoch
        announce_data(dataset, split, cfg.batch.micro, cfg.batch.grad_accum)
    tracker = start_tracking(cfg, run_dir, ctx)
    trainer = Trainer(cfg, ctx, engine, dataset, tracker, loss_fn=loss_function(cfg))
    checkpoints = Checkpointer(cfg, run_dir, ctx, trainer)
    checkpoints.before_marker = save_pause(cfg, run_dir)
    checkpoints.base = base
    evaluations = Evaluations(cfg, run_dir) if ctx.is_main and cfg.eval.harness.every else None
    if evaluations is not None:
        checkpoints.after_commit = evaluations.checkpoint_done
    planned = planned_peak_bytes(run_dir)  # against the first steps' measured peak (no saves yet)
    meter = PeakMeter(ctx.device, engine.model, cfg.train.steps, planned, ctx.is_main)
    tracker.peak_meter = meter
    # Checkpoints first: a test's pause after a step comes once the step is saved.
    heartbeat = heartbeat or Silent()
    heartbeat.untimed_after(checkpoints.saves_after)
    # Before the saves: they are not timed.
    trainer.callbacks = [meter, heartbeat, checkpoints, *debug_callbacks(cfg, ctx.rank)]
    if cfg.train.compile:
        tracker.compile_clock = compile_seconds
        trainer.callbacks.insert(1, EagerWhileMeasured(meter))  # after the meter opens
    if cfg.eval.every and data.val is not None:
        trainer.evaluate = Evaluator(cfg, ctx, engine, data.val, trainer.pipeline)
    mark("built")
    try:
        resumed = checkpoints.resume(restarted=restart_attempt() > 0 or requeued_by_slurm())
        if resumed is not None:
            trainer.continue_from(resumed.step, resumed.totals)
        announce_restart(as_planned, cfg, run_dir, ctx, resumed)
        # metrics.jsonl holds each step once: lines past the checkpoint (or all of them, when
        # training starts over from step 1) belong to a run that did not get to save them.
        tracker.rewind(resumed.step if resumed is not None else 0)
        trained = trainer.train(stop)
        mark("trained")
        heartbeat.end(checkpoints)
        if not trained:
            # Every rank agreed to stop at this step boundary: save, mark, exit 75.
            saved = checkpoints.stop(stop.signal_name if stop is not None else None)
            tracker.close(STOPPED_RESUMABLE)
            return StoppedRun(trainer.step, str(saved) if saved else None)
        saved = checkpoints.save_final()
        # The run's work is saved once metrics.jsonl has every step too (the watchdog looks).
        heartbeat.phase(
            "evaluation",
            final_checkpoint=saved and str(saved),
            steps=cfg.train.steps,
            checkpoints=cfg.checkpoint.enabled,
        )
        stop_at_end(cfg, ctx.rank)
    except BaseException as exc:
        try:
            if isinstance(exc, Exception):  # not an abort (a second Ctrl-C, SystemExit)
                checkpoints.finish_after_failure(exc, stop)
        finally:
            # End the wandb run now (a stop with STOPPED_RESUMABLE shows as preempted).
            code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
            tracker.close(code)
        raise
    meter.close()  # a resumed run may end inside the window
    peak_memory = peak_memory_bytes(ctx.device, meter)  # before the probe resets CUDA's peak
    probe_inputs, probe_targets, _ = trainer.probe_batch()
    # On a replica, rank 0 alone: a tp or pp rank's forward is collective (pp: pipeline below).
    alone = ctx.tp == 1 and ctx.pp == 1
    activations = (
        activation_report(cfg, engine.module, probe_inputs, probe_targets)
        if ctx.is_main and alone
        else {}
    )
    with eager():  # a new shape every decoding step: not worth compiling
        accuracy = (
            exact_match(
                engine.module,
                dataset.eval_problems(),
                cfg.model.seq_len,
                ctx.device,
                cfg.data,
                report=sys.stdout if ctx.is_main else None,
                trained=cfg.train.steps * split.global_size,  # a short run: a short evaluation
            )
            if alone
            else None
        )
    shape = RunShape(
        world_size=ctx.world_size,
        dp=split.dp,
        micro_size=split.micro_size,
        grad_accum=split.grad_accum,
        global_size=split.global_size,
        engine=cfg.engine.name.value,
        ac=cfg.ac.policy.value,
        tp=ctx.tp,
        pp=ctx.pp,
    )
    summary = tracker.summary(
        shape,
        peak_memory=peak_memory,
        eval_accuracy=accuracy,
        resumed_from_step=resumed.step if resumed is not None else None,
        activations=activations,
        planned_peak=planned,
    )
    summary = dataclasses.replace(
        summary,
        final_val_loss=tracker.totals.final_val_loss,
        pipeline=pipeline_summary(ctx, trainer.pipeline, run_dir),  # collective
        mixture=(
            dataset.report(tracker.totals.source_tokens)
            if isinstance(dataset, MixtureDataset)
            else None
        ),
    )
    if evaluations is not None:  # their records before the summary (bounded: eval.harness.wait_s)
        heartbeat.phase("harness wait", allow_s=cfg.eval.harness.wait_s)
        evaluations.finish()
    heartbeat.phase("tracker finish")
    tracker.finish(summary)
    if ctx.is_main:
        acc = f", eval exact-match {accuracy:.3f}" if accuracy is not None else ""
        loss = summary.final_loss
        log.info(
            f"done: {trainer.step} steps, final loss {loss if loss is None else f'{loss:.4f}'}, "
            f"{summary.tokens_per_s:,.0f} tokens/s{acc}. Outputs in {run_dir}"
        )
    mark("done")
    return summary


def run_worker(cfg: RootConfig, run_dir: Path) -> RunEnd:
    """Everything one rank does; the process group is destroyed whatever happens.

    Returns the summary, or a StoppedRun when a stop signal ended it early after a checkpoint.
    """
    if restart_attempt() > 0 and read_stopped(run_dir) is not None:
        # torchrun restarts ranks that exit non-zero; after a deliberate stop nothing may train.
        return StoppedRun()
    with stop_on_signals() as stop:
        ctx = init_distributed(cfg.train.device, cfg.train.process_group_timeout_s)
        mark("initialized")
        setup_logging(ctx.rank)
        warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
        if ctx.is_main and restart_attempt() == 0:
            clear_stopped(run_dir)  # left by an earlier job in this run directory
        # From here to the exit, the watchdog of the agent watches this rank.
        heartbeat = start_heartbeat(cfg, run_dir, ctx.rank)
        status = 1
        try:
            with compile_errors(cfg.train.compile):
                end = train_rank(cfg, run_dir, ctx, stop, heartbeat)
            status = end.exit_status
            return end
        except BaseException:
            if ctx.world_size > 1:
                # Leave the rank's error where the launcher can name it.
                replace_own(rank_error_file(run_dir, ctx.rank), redact(traceback.format_exc()))
            raise
        finally:
            heartbeat.phase("teardown")
            teardown_distributed()
            heartbeat.exit(status)


def run_in_process(cfg: RootConfig, run_dir: Path) -> int:
    """Run this process as the job's only rank (or as one torchrun rank); the exit status."""
    return run_worker(cfg, run_dir).exit_status
