"""The floor for `benchmarks/startup.py` (issue 43): the smallest torchrun job that trains, a DDP
model of an embedding and a linear layer taking one AdamW step on 16 sequences of 24 tokens,
written by hand with no launcher code. With LAUNCHER_TIMINGS=1 it prints the same `timing:` lines
as the launcher's ranks (launcher/logs.py), so that each phase can be set against the launcher's.

    python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/startup_floor.py
"""

from __future__ import annotations

import os
import sys
import time


def mark(phase: str) -> None:
    if os.environ.get("LAUNCHER_TIMINGS") == "1":
        rank = os.environ.get("RANK", "0")
        now, cpu = time.time(), time.process_time()
        sys.stderr.write(f"timing: rank{rank} {phase} {now:.6f} {cpu:.6f}\n")
        sys.stderr.flush()


mark("started")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

VOCAB, SEQ, WIDTH, GLOBAL = 256, 24, 128, 16


def main() -> None:
    mark("imported")
    dist.init_process_group("gloo")
    mark("initialized")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, VOCAB, (GLOBAL // world, SEQ + 1), generator=generator)
    mark("built")
    logits = ddp(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    mark("trained")
    if rank == 0:
        print(f"floor: one step, loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    mark("done")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    mark("exit")
