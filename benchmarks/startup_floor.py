"""The floor for `benchmarks/startup.py`: the smallest torchrun job that does the same work as
`launch train parallel.dp=2 train.steps=1` with the default config (the tiny GPT, one DDP step of
the global batch of 16 sequences of 24 tokens, AdamW), written by hand with no launcher code.

    python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/startup_floor.py
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

VOCAB, SEQ, WIDTH, LAYERS, HEADS, GLOBAL = 256, 24, 128, 2, 4, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def main() -> None:
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(VOCAB, WIDTH), *[Block() for _ in range(LAYERS)], nn.Linear(WIDTH, VOCAB)
    )
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, VOCAB, (GLOBAL // world, SEQ + 1), generator=generator)
    logits = ddp(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    if rank == 0:
        print(f"floor: one step, loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
