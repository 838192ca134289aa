"""What hang detection costs a healthy step: the rank's heartbeat (a file write per step) and the
agent's watchdog thread polling, on vs off (issue 35).

One gloo rank in this process, a small GPT (tiny: a ~11 ms step on the CPU; small: ~0.2 s), the
launcher's real loop (`Trainer.advance`). Rounds alternate between off (no callbacks) and on (the
heartbeat as the step callback, as launcher/worker/run.py places it, and a Watchdog thread polling
every 0.1 s, its fastest rate, here in the rank's own process, where it contends for the GIL, which
the agent's watchdog does not: an upper bound); the first round warms up and is dropped. The figure
is the ratio of the median step times, on / off.

    .venv/bin/python -m benchmarks.hang_overhead [--rounds 6] [--steps 10] [--model tiny|small]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from launcher.config import to_root_config
from launcher.distributed import init_distributed, teardown_distributed
from launcher.engines import build_engine
from launcher.runners.watchdog import Watchdog
from launcher.tracking.tracker import Tracker
from launcher.training.loop import Trainer
from launcher.worker.heartbeat import Heartbeat
from launcher.worker.run import build_data, build_model

MODELS = {
    "tiny": {"name": "small", "n_layer": 2, "n_head": 4, "d_model": 128, "seq_len": 64},
    "small": {"name": "small", "n_layer": 6, "n_head": 6, "d_model": 384, "seq_len": 64},
}


def measure(run_dir: Path, model: str, rounds: int, steps: int) -> dict[str, list[float]]:
    total = (rounds + 1) * 2 * steps
    cfg = to_root_config(
        {
            "model": MODELS[model],
            "batch": {"global_size": 4},
            "train": {"steps": total},
            "checkpoint": {"every": 0},
            "wandb": {"mode": "disabled"},
        }
    )
    ctx = init_distributed("cpu")
    times: dict[str, list[float]] = {"off": [], "on": []}
    try:
        net = build_model(cfg)
        engine = build_engine(cfg, net, ctx)
        tracker = Tracker(run_dir, total, total, enabled=False)
        trainer = Trainer(cfg, ctx, engine, build_data(cfg, net).train, tracker)
        heartbeat = Heartbeat(run_dir, 0, cfg.train.hang_timeout, lambda s: False)
        for r in range(rounds + 1):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            for mode in order:
                on = mode == "on"
                trainer.callbacks = [heartbeat] if on else []
                with Watchdog(run_dir, poll_s=0.1) if on else nullcontext():
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        trainer.advance()
                    trainer.flush()
                    elapsed = (time.perf_counter() - t0) / steps
                if r:
                    times[mode].append(elapsed)
        heartbeat.end()
    finally:
        teardown_distributed()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--model", default="tiny", choices=sorted(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        times = measure(Path(tmp), args.model, args.rounds, args.steps)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(json.dumps({k: [round(t * 1e3, 2) for t in v] for k, v in times.items()}))
    print(f"median step: off {off * 1e3:.2f} ms, on {on * 1e3:.2f} ms; on/off = {on / off:.3f}")


if __name__ == "__main__":
    main()
