"""The measuring loop shared by the in-process overhead benchmarks: the launcher's real Trainer
and a hand-written loop run in the same ranks, alternated round by round so machine noise hits
both alike, plus the per-step counts all-reduce timed on its own."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from launcher.training.loop import Trainer
from launcher.training.loss import StepCounts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def interleaved_rounds(
    trainer: Trainer,
    hand_step: Callable[[], None],
    rounds: int,
    steps: int,
    hand_name: str,
    alternate_order: bool = False,
) -> dict[str, list[float]]:
    """Seconds per step of each loop per round (the warm-up round dropped), and of the counts
    all-reduce alone. alternate_order: swap which loop goes first every other round."""
    times: dict[str, list[float]] = {"launcher": [], hand_name: [], "step_all_reduce": []}
    carry = torch.zeros((), dtype=torch.float64)
    for r in range(rounds + 1):  # the first round warms up and is dropped
        order = ("launcher", hand_name)
        if alternate_order and r % 2:
            order = (hand_name, "launcher")
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            if name == "launcher":
                for _ in range(steps):
                    trainer.advance()
                trainer.flush()
                trainer.batches.wait()
            else:
                for _ in range(steps):
                    hand_step()
            times[name].append((time.perf_counter() - start) / steps)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            StepCounts(1234, False, carry, trainer.ctx.device).read(4096)
        times["step_all_reduce"].append((time.perf_counter() - start) / steps)
    return {k: v[1:] for k, v in times.items()}
