"""How long a checkpoint stops training, synchronous vs checkpoint.async=true (issue 24).

One gloo rank in this process, a ~100M-parameter GPT (14 blocks, d_model 768), one sequence of
64 tokens per step, a checkpoint every 2 steps. For each mode: the time the training thread spends
in each periodic save (sync: the whole save; async: waiting for the previous save, if still in
flight, plus the copy to host memory), the mean step time, and the wait for the last save at the
end. The async/sync ratio of the stall is the figure of merit.

    .venv/bin/python -m benchmarks.checkpoint_stall [--steps 8] [--every 2] [--device cuda]
        [--model 100m|small]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from launcher.checkpoint.checkpointer import Checkpointer
from launcher.config import to_root_config
from launcher.distributed import init_distributed, teardown_distributed
from launcher.engines import build_engine
from launcher.tracking.tracker import Tracker
from launcher.training.loop import Trainer
from launcher.worker.run import build_data, build_model

MODELS = {
    "100m": {"name": "100m", "n_layer": 14, "n_head": 12, "d_model": 768, "seq_len": 64},
    "small": {"name": "small", "n_layer": 6, "n_head": 6, "d_model": 384, "seq_len": 64},
}
MODEL = MODELS["100m"]


def measure(
    run_dir: Path,
    steps: int,
    every: int,
    asynchronous: bool,
    device: str = "cpu",
    model: dict[str, Any] = MODEL,
) -> dict[str, Any]:
    cfg = to_root_config(
        {
            "model": model,
            "batch": {"global_size": 1},
            "train": {"steps": steps, "device": device},
            "checkpoint": {"every": every, "async": asynchronous, "keep": 2},
            "wandb": {"mode": "disabled"},
        }
    )
    ctx = init_distributed(device)
    try:
        net = build_model(cfg)
        params = sum(p.numel() for p in net.parameters())
        engine = build_engine(cfg, net, ctx)
        tracker = Tracker(run_dir, steps, steps, enabled=False)
        trainer = Trainer(cfg, ctx, engine, build_data(cfg, net).train, tracker)
        saver = Checkpointer(cfg, run_dir, ctx, trainer)
        stalls, step_times = [], []
        started = time.perf_counter()
        for _ in range(steps):
            t0 = time.perf_counter()
            result = trainer.train_step(trainer.step)
            trainer.step += 1
            tracker.log_step(result.metrics(trainer.split))
            t1 = time.perf_counter()
            saver.after_step(trainer.step)
            t2 = time.perf_counter()
            step_times.append(t1 - t0)
            if trainer.step % every == 0 and trainer.step < steps:
                stalls.append(t2 - t1)
        t3 = time.perf_counter()
        saver.save_final()
        final_s = time.perf_counter() - t3
        total_s = time.perf_counter() - started
    finally:
        teardown_distributed()
    return {
        "mode": "async" if asynchronous else "sync",
        "device": str(ctx.device),
        "params_m": round(params / 1e6, 1),
        "stalls_s": [round(s, 3) for s in stalls],
        "stall_mean_s": statistics.mean(stalls),
        "step_mean_s": statistics.mean(step_times),
        "final_save_s": final_s,
        "total_s": total_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="100m", choices=sorted(MODELS))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        for asynchronous in (False, True):
            run_dir = Path(tmp) / ("async" if asynchronous else "sync")
            rows.append(
                measure(
                    run_dir, args.steps, args.every, asynchronous, args.device, MODELS[args.model]
                )
            )
            print(json.dumps(rows[-1]), flush=True)
    sync, done = rows
    ratio = done["stall_mean_s"] / sync["stall_mean_s"]
    print(f"stall per checkpoint: async/sync = {ratio:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "stall_ratio": ratio}, indent=2) + "\n")


if __name__ == "__main__":
    main()
