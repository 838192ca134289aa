"""Launcher step time vs a minimal hand-written DDP loop with no_sync (the floor), 2 gloo ranks.

Both loops run in the same two processes on the same model, data and split (dp 2 x accumulation
4), interleaved round by round so machine noise hits both alike; the figure is the ratio of their
median step times. The launcher runs its real loop (`Trainer.advance`: the lagged logging, the
background prefetch) and each round ends with its flush and the prefetch of the next step done,
inside the timed region. Also times the launcher's one per-step collective (counts, stop flag and
the previous step's loss) on its own, and reports the launcher's own data and comm waits.

    .venv/bin/python -m benchmarks.ddp_overhead [--rounds 7] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from benchmarks.interleave import free_port, interleaved_rounds
from launcher.config import to_root_config
from launcher.data import build_dataset
from launcher.data.sequence import collate
from launcher.distributed import init_distributed
from launcher.engines import build_engine
from launcher.engines.optim import build_optimizer
from launcher.tracking.tracker import Tracker
from launcher.training.loop import Trainer
from launcher.worker.run import build_model

WORLD = 2
CONFIG = {
    "parallel": {"dp": WORLD},
    "batch": {"global_size": 32, "grad_accum": 4},
    "model": {"n_layer": 4, "n_head": 4, "d_model": 128, "seq_len": 64},
    "data": {"max_len": 24},
    "wandb": {"mode": "disabled"},
    "train": {"steps": 10_000},
}


def floor_step(
    model: DistributedDataParallel, optimizer: torch.optim.Optimizer, dataset, indices
) -> None:
    """The textbook loop: per-micro-batch mean loss, no_sync on all but the last, clip, step."""
    batches = [collate([dataset[i] for i in mb]) for mb in indices]
    for m, (inputs, targets) in enumerate(batches):
        ctx = model.no_sync() if m < len(batches) - 1 else nullcontext()
        with ctx:
            logits = model(inputs)
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
            )
            (loss / len(batches)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _rank(rank: int, port: int, rounds: int, steps: int, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // WORLD))
    ctx = init_distributed("cpu")
    cfg = to_root_config(CONFIG)
    dataset = build_dataset(cfg.data, cfg.model.seq_len, 0)
    trainer = Trainer(
        cfg,
        ctx,
        build_engine(cfg, build_model(cfg), ctx),
        dataset,
        Tracker(Path(out), 1, 1, enabled=False),
    )
    floor_model = DistributedDataParallel(build_model(cfg))
    floor_opt = build_optimizer(floor_model.module, cfg.optim)
    split = cfg.split()
    step_index = 0

    def floor_once() -> None:
        nonlocal step_index
        floor_step(
            floor_model, floor_opt, dataset, trainer.sampler.micro_batches(step_index, split, rank)
        )
        step_index += 1

    times = interleaved_rounds(trainer, floor_once, rounds, steps, "floor")
    totals = trainer.tracker.totals
    times["launcher_data_s"] = [totals.data_s / totals.steps]  # every round, warm-up included
    times["launcher_comm_s"] = [totals.comm_wait_s / totals.steps]
    trainer.batches.close()
    if rank == 0:
        Path(out, "times.json").write_text(json.dumps(times))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(free_port(), args.rounds, args.steps, out), nprocs=WORLD, join=True)
        times = json.loads(Path(out, "times.json").read_text())
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [a / b for a, b in zip(times["launcher"], times["floor"], strict=True)]
    print(
        "| model | split | launcher step | floor step | "
        f"launcher / floor (median of {args.rounds} rounds) "
        "| step all-reduce | launcher data wait | launcher comm wait |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| GPT 4x128, seq 64 | dp 2 x accum 4 x micro 4 | {med['launcher'] * 1e3:.1f} ms "
        f"| {med['floor'] * 1e3:.1f} ms "
        f"| {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}) "
        f"| {med['step_all_reduce'] * 1e6:.0f} us ({med['step_all_reduce'] / med['launcher']:.2%}) "
        f"| {med['launcher_data_s'] * 1e6:.0f} us | {med['launcher_comm_s'] * 1e6:.0f} us |"
    )


if __name__ == "__main__":
    main()
