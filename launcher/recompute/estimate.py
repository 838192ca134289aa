"""Activation memory and recompute FLOPs of one micro-batch per policy, estimated from the shape
(what `launch plan` prints; runs report the measured figures from launcher/recompute/measure.py).

Counted per token for the built-in GPT (width h, MLP ratio r, heads a, vocabulary V, fused
attention that keeps its output and log-sum-exp, not the score matrix), in the run's precision
(norm statistics, log-sum-exp and the fp32 log-softmax of the loss in 4 bytes):

- a kept block saves (8 + 2r)h values: its input, both norm outputs, q/k/v, the attention
  output, the residual after attention, the MLP hidden before and after GELU (+2h one-byte
  dropout masks when dropout > 0);
- a recomputed segment keeps only its input (h), and rematerialises its blocks in backward;
- a selective block keeps (6 + r)h: input, q/k/v, attention output, attention projection, MLP
  hidden before GELU (+h, the MLP projection, with dropout);
- outside the blocks: the final norm's input and output (2h) and the log-softmax (V, fp32).

The peak is what is kept plus the loss's backward (two fp32 V-vectors per token), or, if larger,
what is still kept when a recomputed segment is rematerialised, plus that segment and gradients.
These match the CPU measurements of the built-in model closely
(tests/unit/test_memory_estimate.py); a GPU kernel may keep a little more or less.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.ac import AcPolicy
from launcher.config.model import ModelConfig
from launcher.config.root import RootConfig
from launcher.engines.precision import bytes_per_element
from launcher.recompute.segments import Segment, SegmentMode, plan_segments

FP32 = 4


@dataclass(frozen=True)
class ActivationEstimate:
    activation_bytes: int
    activation_peak_bytes: int
    recompute_flops_ratio: float

    def to_json(self) -> dict[str, float]:
        return {
            "activation_bytes": self.activation_bytes,
            "activation_peak_bytes": self.activation_peak_bytes,
            "recompute_flops_ratio": round(self.recompute_flops_ratio, 4),
        }


def _gpt(cfg: RootConfig) -> ModelConfig:
    if not isinstance(cfg.model, ModelConfig):
        raise TypeError("activation estimates need the built-in GPT's shape")
    return cfg.model


def estimate_activations(cfg: RootConfig, micro_size: int, policy: AcPolicy) -> ActivationEstimate:
    m = _gpt(cfg)
    h, r, a, vocab, n = m.d_model, m.mlp_ratio, m.n_head, m.vocab, m.n_layer
    width = bytes_per_element(cfg.train.precision)
    dropout = m.dropout > 0
    tokens = micro_size * m.seq_len

    stats = FP32 * (a + 4)  # log-sum-exp per head, mean and rstd of the two norms
    kept_block = width * (8 + 2 * r) * h + stats + (2 * h if dropout else 0)
    selective_block = width * (6 + r + (1 if dropout else 0)) * h + FP32 * a
    outside = width * 2 * h + FP32 * (vocab + 2) + (h if dropout else 0)

    segments = plan_segments(policy, n, cfg.ac.every_n)
    kept = [_kept(s, kept_block, selective_block, width * h) for s in segments]
    per_token = outside + sum(kept)
    # Backward runs the segments last to first: when segment i is rematerialised, what the
    # segments after it kept is already freed.
    gradients = width * (1 + r) * h  # the incoming gradient and the MLP hidden's
    rematerialise = [
        outside + sum(kept[: i + 1]) + _rematerialised(s, kept_block, selective_block) + gradients
        for i, s in enumerate(segments)
        if s.mode != SegmentMode.keep
    ]
    peak = max([per_token + 2 * FP32 * vocab, *rematerialise])
    return ActivationEstimate(
        activation_bytes=tokens * per_token,
        activation_peak_bytes=tokens * peak,
        recompute_flops_ratio=_flops_ratio(cfg, segments),
    )


def _kept(segment: Segment, kept_block: int, selective_block: int, block_input: int) -> int:
    if segment.mode == SegmentMode.keep:
        return segment.size * kept_block
    if segment.mode == SegmentMode.selective:
        return segment.size * selective_block
    return block_input


def _rematerialised(segment: Segment, kept_block: int, selective_block: int) -> int:
    if segment.mode == SegmentMode.selective:
        return kept_block - selective_block  # one block's recomputed cheap ops
    return segment.size * kept_block


def _flops_ratio(cfg: RootConfig, segments: tuple[Segment, ...]) -> float:
    """Training FLOPs with recompute over without, per token: matmuls 2x forward in backward,
    fused attention 2.5x (it recomputes the scores). A recomputed segment reruns its forward
    except, without dropout, the last MLP projection: nothing after it needs saving, so
    recompute stops before it (torch's checkpoint early stop)."""
    m = _gpt(cfg)
    h, r, t = m.d_model, m.mlp_ratio, m.seq_len
    block_mm = 2 * (4 + 2 * r) * h * h
    block_attention = 4 * h * t
    head = 2 * h * m.vocab
    total = m.n_layer * (3 * block_mm + 3.5 * block_attention) + 3 * head
    skipped = 0 if m.dropout > 0 else 2 * r * h * h
    extra = sum(
        s.size * (block_mm + block_attention) - skipped
        for s in segments
        if s.mode == SegmentMode.full
    )
    return (total + extra) / total


def estimate_all(cfg: RootConfig, micro_size: int) -> dict[str, ActivationEstimate]:
    """Every policy, in the order of AcPolicy (every_n with the configured ac.every_n). Empty for
    a user model: its shape is unknown here, so nothing is guessed (runs measure it)."""
    if not isinstance(cfg.model, ModelConfig):
        return {}
    return {p.value: estimate_activations(cfg, micro_size, p) for p in AcPolicy.granularities()}
