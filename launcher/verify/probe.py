"""Evidence about the model itself, gathered in this process on the reference's config: what a
failed certificate's diagnosis (launcher/verify/diagnose.py) rests on besides the two runs.

- batch-dependent layers by module type (BatchNorm, LocalResponseNorm);
- whether one sample's output depends on the other samples of its batch (the split's first
  micro-batch run alone, and inside the whole global batch);
- whether the forward draws random numbers with dropout off;
- whether the forward returns a loss of its own;
- the valid-token count of every micro-batch of the split's first step (padding, masking).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from launcher.config.root import RootConfig
from launcher.data.sampler import sampler_for
from launcher.data.sequence import Batch, collate, collate_batch
from launcher.models.output import LogitsForward, logits_of
from launcher.training.loss import valid_tokens
from launcher.verify.compare import tensor_gap
from launcher.verify.rank import switch_off_dropout
from launcher.worker.run import BATCH_DEPENDENT, build_data, build_model


@dataclass
class ModelEvidence:
    batch_dependent: dict[str, str] = field(default_factory=dict)
    """Module name -> type name of every batch-dependent layer."""
    sample_dependence: float = 0.0
    """Gap between the first micro-batch's outputs alone and inside the global batch."""
    draws_random: bool = False
    """The forward advanced the random generator (dropout off)."""
    own_loss: bool = False
    """The forward's output carries a loss of its own."""
    micro_valid: list[list[int]] = field(default_factory=list)
    """Per rank, per micro-batch of step 1: valid target tokens."""
    positions_per_micro: int = 0


def _raw_forward(model: torch.nn.Module, batch: Batch) -> Any:
    forward = model.forward
    inner = forward.inner if isinstance(forward, LogitsForward) else forward
    return inner(batch.inputs, **batch.model_kwargs())


def _has_own_loss(output: Any) -> bool:
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    return isinstance(loss, torch.Tensor)


def gather_evidence(reference: RootConfig, split: RootConfig) -> ModelEvidence:
    """Forward passes only, on the CPU, in training mode (as the runs computed)."""
    model = build_model(reference)
    switch_off_dropout(model)
    model.train()
    evidence = ModelEvidence(
        batch_dependent={
            name: type(m).__name__
            for name, m in model.named_modules()
            if isinstance(m, BATCH_DEPENDENT)
        }
    )
    data = build_data(reference, model).train
    shape = split.split()
    sampler = sampler_for(data, shape.global_size, reference.train.seed, reference.data.order.value)
    for rank in range(shape.dp):
        micro = sampler.micro_batches(0, shape, rank)
        evidence.micro_valid.append([valid_tokens(collate([data[i] for i in m])[1]) for m in micro])
    evidence.positions_per_micro = shape.micro_size * reference.model.seq_len
    whole = collate_batch([data[i] for i in sampler.global_batch(0)])
    first = whole.head(shape.micro_size)
    with torch.no_grad():
        state = torch.get_rng_state()
        alone = _raw_forward(model, first)
        evidence.draws_random = not torch.equal(state, torch.get_rng_state())
        evidence.own_loss = _has_own_loss(alone)
        together = logits_of(_raw_forward(model, whole))
        alone_logits = logits_of(alone)
    if alone_logits is not None and together is not None and shape.micro_size < len(whole[0]):
        evidence.sample_dependence = tensor_gap(
            alone_logits.float(), together[: shape.micro_size].float()
        )
    return evidence
