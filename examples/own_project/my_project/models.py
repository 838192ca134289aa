"""MyNet: a small decoder-only transformer language model, written the way a user writes one.

Nothing here knows about the launcher: no distributed code, no loss. `forward(input_ids)` returns
logits `[batch, seq, vocab]`; the launcher computes the token-exact loss from them. The repeated
blocks live in one `nn.ModuleList` (`blocks`), which is what the recompute policies and FSDP's
per-block sharding act on (found automatically, or named with `model.blocks=blocks`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Causal self-attention. q, k and v are layers of their own and the heads are counted from
    the tensor (view with -1), so that a tensor-parallel plan can split them by heads (model.tp_plan
    in conf/model/my_net.yaml: each rank then holds n_head / tp whole heads)."""

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.head_dim, self.dropout = d_model // n_head, dropout
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (
            z.view(b, t, -1, self.head_dim).transpose(1, 2)
            for z in (self.q(x), self.k(x), self.v(x))
        )
        p = self.dropout if self.training else 0.0
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return self.out(att.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    """Pre-norm causal self-attention and an MLP, each on a residual path."""

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_head, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, 4 * d_model)
        self.down = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.down(F.gelu(self.up(self.norm2(x)))))


class MyNet(nn.Module):
    """Token and position embeddings, `n_layer` blocks, a final norm and an output layer."""

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int = 128,
        n_layer: int = 2,
        n_head: int = 4,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model={d_model} is not divisible by n_head={n_head}")
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout) for _ in range(n_layer))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos[: input_ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
