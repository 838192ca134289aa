"""A decoder-only GPT: pre-norm blocks, causal attention through scaled_dot_product_attention.

`GPT.blocks` is the one list of blocks; `GPT.run_blocks` runs them, and activation-checkpoint
policies (launcher/recompute/policies.py) replace it without re-parenting any block, so parameter
names and state_dict keys never depend on the policy.

Generation (launcher/serve/) passes a `KVCache` and each row's positions to `forward`: each row
of the batch is one request with its own cache slot, keys and values of earlier tokens are read
from the cache, and a row attends only to its own positions (so rows of different lengths can
be decoded together). Without a cache, `forward` is the training path, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from launcher.config.model import ModelConfig
from launcher.models.documents import block_causal_mask


class KVCache:
    """Keys and values of every layer for `slots` requests, up to `length` positions each:
    per layer a (slots, length, n_head, head_dim) tensor. Zero-filled, so positions a row may not
    attend to always hold finite numbers (a masked NaN would still poison the softmax)."""

    def __init__(
        self,
        n_layer: int,
        slots: int,
        length: int,
        n_head: int,
        head_dim: int,
        *,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        shape = (slots, length, n_head, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.length = length


@dataclass
class CacheView:
    """One forward's view of a KVCache: which slot each row is, and each new token's position."""

    cache: KVCache
    slots: torch.Tensor
    """(batch,) slot index of each row."""
    positions: torch.Tensor
    """(batch, time) position of each new token (its index in its own request)."""
    span: int
    """Positions read from the cache: the largest position + 1 (read once, not per layer)."""
    layer: int = 0

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this step's keys and values, then attend each row to its own positions up to
        each query's. q, k, v: (batch, n_head, time, head_dim)."""
        keys, values = self.cache.keys[self.layer], self.cache.values[self.layer]
        rows = self.slots[:, None]
        keys[rows, self.positions] = k.transpose(1, 2).to(keys.dtype)
        values[rows, self.positions] = v.transpose(1, 2).to(values.dtype)
        span = self.span
        past_k = keys[self.slots, :span].transpose(1, 2).to(q.dtype)
        past_v = values[self.slots, :span].transpose(1, 2).to(q.dtype)
        visible = torch.arange(span, device=q.device)[None, None, :] <= self.positions[:, :, None]
        return F.scaled_dot_product_attention(q, past_k, past_v, attn_mask=visible[:, None])


class CausalSelfAttention(nn.Module):
    """`qkv` is fused, its output rows grouped by head: [q; k; v] of head 0, then of head 1, ...
    So any contiguous run of rows holds whole heads of q, k and v (a tensor-parallel rank's
    share, launcher/parallel/gpt_plan.py), and forward counts the heads it got from the
    projection's width, never from the config."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.d_model // cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(
        self, x: torch.Tensor, kv: CacheView | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, t = x.shape[:2]
        qkv = self.qkv(x)
        heads = qkv.shape[-1] // (3 * self.head_dim)
        q, k, v = (z.transpose(1, 2) for z in qkv.view(b, t, heads, 3, self.head_dim).unbind(dim=3))
        dropout = self.dropout if self.training else 0.0
        if kv is not None:
            y = kv.attend(q, k, v)
        elif mask is not None:  # packed documents: block-causal
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
        y = y.transpose(1, 2).reshape(b, t, heads * self.head_dim)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.act = nn.GELU(approximate="tanh")
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """Pre-norm: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, kv: CacheView | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), kv, mask)
        return x + self.mlp(self.ln_2(x))


BlockRunner = Callable[..., torch.Tensor]
"""(blocks, x) -> x; (blocks, x, mask) for packed documents (mask: block_causal_mask's)."""


def run_in_order(
    blocks: nn.ModuleList, x: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    for block in blocks:
        x = block(x) if mask is None else block(x, mask=mask)
    return x


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.run_blocks: BlockRunner = run_in_order
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.head.weight = self.tok_emb.weight  # tied embeddings
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / (2 * cfg.n_layer) ** 0.5)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        slots: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids (batch, time) -> logits (batch, time, vocab).

        With a cache (generation): row i is cache slot slots[i], its tokens sit at
        positions[i]; earlier tokens of each row are read from the cache, these are added.
        position_ids (training on packed documents, launcher/models/documents.py): each token's
        position in its own document; attention is block-causal within each document."""
        if cache is not None:
            assert slots is not None and positions is not None
            span = int(positions.max()) + 1
            return self._forward_cached(idx, CacheView(cache, slots, positions, span))
        if position_ids is not None:
            x = self.drop(self.tok_emb(idx) + self.pos_emb(position_ids))
            x = self.run_blocks(self.blocks, x, block_causal_mask(position_ids))
            return self.head(self.ln_f(x))
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        x = self.run_blocks(self.blocks, x)
        return self.head(self.ln_f(x))

    def _forward_cached(self, idx: torch.Tensor, view: CacheView) -> torch.Tensor:
        x = self.drop(self.tok_emb(idx) + self.pos_emb(view.positions))
        for layer, block in enumerate(self.blocks):  # called as modules: FSDP's hooks still run
            view.layer = layer
            x = block(x, view)
        return self.head(self.ln_f(x))

    def new_cache(self, slots: int, *, device: torch.device, dtype: torch.dtype) -> KVCache:
        """An empty KV cache for `slots` requests of up to model.seq_len tokens each."""
        cfg = self.cfg
        head_dim = cfg.d_model // cfg.n_head
        return KVCache(
            cfg.n_layer, slots, cfg.seq_len, cfg.n_head, head_dim, device=device, dtype=dtype
        )

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
