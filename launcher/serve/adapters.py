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

from launcher.data.build import vocab_of as output_vocab
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
    """A transformers causal LM. Prefill: the prompt alone through the model's own cache
    (DynamicCache). Decode: every active slot in one forward, from per-slot key/value buffers:
    row i holds its slot's n_i cached positions, padded on the right to the longest; the
    attention mask hides the padding and position_ids give each row its own position, so a row
    computes what it would alone. A model whose forward takes no attention_mask/position_ids, or
    whose cache is not plain per-layer keys and values, decodes slot by slot (exact, unbatched)."""

    def __init__(self, model: nn.Module, slots: int, device: torch.device | None = None) -> None:
        from transformers import DynamicCache

        self.model, self.device = model, device or _device_of(model)
        self.config = getattr(model, "config", None)
        self.new_cache = DynamicCache
        self.caches: list[Any] = [None] * slots
        limit = getattr(self.config, "max_position_embeddings", None) or getattr(
            self.config, "n_positions", None
        )
        self.context = int(limit) if limit else 1 << 30
        # transformers 5 names the argument `cache` (past_key_values is deprecated there).
        forward = getattr(model.forward, "inner", model.forward)
        params = inspect.signature(forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.batched = "attention_mask" in params and "position_ids" in params
        self.slots = slots
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths = [0] * slots

    def _logits(self, ids: torch.Tensor, cache: Any, **extra: torch.Tensor) -> torch.Tensor:
        output = self.model(input_ids=ids, use_cache=True, **{self.cache_arg: cache}, **extra)
        logits = logits_of(output)
        assert logits is not None
        return logits

    def _plain_layers(self, cache: Any) -> bool:
        layers: list[Any] = list(getattr(cache, "layers", None) or [])
        return bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)

    def _store(self, slot: int, cache: Any) -> None:
        """The prompt's keys and values into the slot's buffers (allocated on first use)."""
        layers = cache.layers
        n = layers[0].keys.shape[2]
        if not self.keys:
            for layer in layers:
                heads, dim = layer.keys.shape[1], layer.keys.shape[3]
                shape = (self.slots, heads, 64, dim)
                self.keys.append(layer.keys.new_zeros(shape))
                self.values.append(layer.values.new_zeros(shape))
        self._reserve(n + 1)
        for i, layer in enumerate(layers):
            self.keys[i][slot, :, :n] = layer.keys[0]
            self.values[i][slot, :, :n] = layer.values[0]
        self.lengths[slot] = n

    def _reserve(self, positions: int) -> None:
        """Room for `positions` per slot: the buffers double as the longest request grows (a
        long context costs memory only when a request uses it)."""
        have = self.keys[0].shape[2]
        if positions <= have:
            return
        size = max(positions, 2 * have)
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                grown = old.new_zeros((*old.shape[:2], size, old.shape[3]))
                grown[:, :, :have] = old
                buffers[i] = grown

    def prefill(self, slot: int, ids: list[int], every: bool = False) -> torch.Tensor:
        cache: Any = self.new_cache(config=self.config)
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        logits = self._logits(tokens, cache)[0]
        if self.batched and self._plain_layers(cache):
            self._store(slot, cache)
        else:
            self.batched = False
            self.caches[slot] = cache
        return logits if every else logits[-1]

    def decode(self, slots: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None]
        if not self.batched:  # the model's cache knows its length
            return torch.stack(
                [self._logits(ids[i : i + 1], self.caches[s])[0, -1] for i, s in enumerate(slots)]
            )
        lengths = [self.lengths[s] for s in slots]
        longest = max(lengths)
        self._reserve(longest + 1)
        rows = torch.tensor(slots, dtype=torch.long, device=self.device)
        cache: Any = self.new_cache(config=self.config)
        for i in range(len(self.keys)):
            cache.update(self.keys[i][rows, :, :longest], self.values[i][rows, :, :longest], i)
        mask = torch.zeros(len(slots), longest + 1, dtype=torch.long, device=self.device)
        for row, n in enumerate(lengths):
            mask[row, :n] = 1
        mask[:, longest] = 1
        where = torch.tensor(positions, dtype=torch.long, device=self.device)[:, None]
        logits = self._logits(ids, cache, attention_mask=mask, position_ids=where)
        for i, layer in enumerate(cache.layers):
            for row, (slot, n) in enumerate(zip(slots, lengths, strict=True)):
                self.keys[i][slot, :, n] = layer.keys[row, :, longest]
                self.values[i][slot, :, n] = layer.values[row, :, longest]
        for slot, n in zip(slots, lengths, strict=True):
            self.lengths[slot] = n + 1
        return logits[:, -1]


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
    return output_vocab(model)  # a built-in GPT built with vocab_size=auto: its output layer


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
