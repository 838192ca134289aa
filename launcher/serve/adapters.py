"""How the engine runs a model: prefill one request into its slot, and one decode step for many.

- The built-in GPT: one KV cache with a slot per request; a decode step is one batched forward
  over every active request, each row at its own position and attending only to its own slot.
- A Hugging Face transformers model: each slot keeps the model's own cache (past_key_values);
  a decode step runs the slots one after another (batch 1 each), so no padding, position-id or
  mask convention of the model is involved. Exact, but not batched.
- Any other model that returns logits: no cache; each step recomputes each request's whole
  sequence (exact, slow: for the end-of-training evaluation of user models).

Every call is a plain `model(...)` call, so a model wrapped by FSDP (the evaluation at the end of
training) gathers its parameters as in training.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import torch
from torch import nn

from launcher.models.gpt import GPT
from launcher.models.output import logits_of


class Adapter(Protocol):
    context: int
    """Positions a request may use (prompt and generated tokens, the last not fed back)."""

    def prefill(self, slot: int, ids: list[int], every: bool = False) -> torch.Tensor:
        """Run a new request's prompt into `slot`; the logits (vocab,) after its last token, or
        (every=True) after each of its tokens, (len(ids), vocab)."""
        ...

    def decode(self, slots: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Feed token i at positions[i] of slot slots[i]; the next logits, (len(slots), vocab)."""
        ...


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


class GPTAdapter:
    def __init__(self, model: GPT, slots: int, device: torch.device | None = None) -> None:
        self.model, self.device = model, device or _device_of(model)
        self.context = model.cfg.seq_len
        dtype = torch.get_autocast_dtype(self.device.type) if torch.is_autocast_enabled() else None
        self.cache = model.new_cache(
            slots, device=self.device, dtype=dtype or model.tok_emb.weight.dtype
        )

    def _run(self, ids: torch.Tensor, slots: list[int], positions: torch.Tensor) -> torch.Tensor:
        slot_ids = torch.tensor(slots, dtype=torch.long, device=self.device)
        return self.model(ids, self.cache, slot_ids, positions)

    def prefill(self, slot: int, ids: list[int], every: bool = False) -> torch.Tensor:
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        positions = torch.arange(len(ids), device=self.device)[None]
        logits = self._run(tokens, [slot], positions)[0]
        return logits if every else logits[-1]

    def decode(self, slots: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None]
        where = torch.tensor(positions, dtype=torch.long, device=self.device)[:, None]
        return self._run(ids, slots, where)[:, -1]


def _is_transformers(model: nn.Module) -> bool:
    return callable(getattr(model, "get_output_embeddings", None)) and hasattr(model, "config")


class HFAdapter:
    """A transformers causal LM through its own cache, one slot at a time."""

    def __init__(self, model: nn.Module, slots: int, device: torch.device | None = None) -> None:
        from transformers import DynamicCache

        self.model, self.device = model, device or _device_of(model)
        self.new_cache = DynamicCache
        self.caches: list[Any] = [None] * slots
        config = model.config
        limit = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )
        self.context = int(limit) if limit else 1 << 30
        # transformers 5 names the argument `cache` (past_key_values is deprecated there).
        forward = getattr(model.forward, "inner", model.forward)
        self.cache_arg = (
            "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
        )

    def _forward(self, slot: int, ids: list[int]) -> torch.Tensor:
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        cache = {self.cache_arg: self.caches[slot]}
        output = self.model(input_ids=tokens, use_cache=True, **cache)
        logits = logits_of(output)
        assert logits is not None
        return logits[0]

    def prefill(self, slot: int, ids: list[int], every: bool = False) -> torch.Tensor:
        self.caches[slot] = self.new_cache(config=getattr(self.model, "config", None))
        logits = self._forward(slot, ids)
        return logits if every else logits[-1]

    def decode(self, slots: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        del positions  # the model's cache knows its length
        return torch.stack([self._forward(s, [t])[-1] for s, t in zip(slots, tokens, strict=True)])


class RecomputeAdapter:
    """Any model whose forward maps token ids to logits: the whole sequence every step."""

    def __init__(self, model: nn.Module, slots: int, context: int, device: torch.device) -> None:
        self.model, self.device, self.context = model, device, context
        self.sequences: list[list[int]] = [[] for _ in range(slots)]

    def _logits(self, slot: int) -> torch.Tensor:
        ids = torch.tensor([self.sequences[slot]], dtype=torch.long, device=self.device)
        logits = logits_of(self.model(ids))
        assert logits is not None
        return logits[0]

    def prefill(self, slot: int, ids: list[int], every: bool = False) -> torch.Tensor:
        self.sequences[slot] = list(ids)
        logits = self._logits(slot)
        return logits if every else logits[-1]

    def decode(self, slots: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        for slot, token in zip(slots, tokens, strict=True):
            self.sequences[slot].append(token)
        return torch.stack([self._logits(s)[-1] for s in slots])


def vocab_of(model: nn.Module) -> int | None:
    """The model's vocabulary size, where it says (token-id prompts are checked against it)."""
    for config in (getattr(model, "config", None), getattr(model, "cfg", None)):
        size = getattr(config, "vocab_size", None)
        if isinstance(size, int):
            return size
    return None


def adapter_for(
    model: nn.Module, slots: int, context: int, device: torch.device | None = None
) -> Adapter:
    """The adapter that suits the model (context: the run's model.seq_len)."""
    device = device or _device_of(model)
    if isinstance(model, GPT):
        return GPTAdapter(model, slots, device)
    if _is_transformers(model):
        hf = HFAdapter(model, slots, device)
        hf.context = min(hf.context, context)
        return hf
    return RecomputeAdapter(model, slots, context, device)
