"""Model FLOPs per token and the device peaks they are compared with (MFU, HFU).

FLOPs per token, forward and backward, after the PaLM paper (Chowdhery et al. 2022, appendix B):

    6 * N  +  12 * L * H * Q * T

N is the number of NON-EMBEDDING parameters (token and position embeddings excluded; with tied
embeddings this also leaves out the output head's matmul, as PaLM does), L layers, H heads, Q the
head dimension and T the sequence length. The second term is attention's score and value matmuls.
MFU = model FLOPs per second / the peak of all devices; every position of every sequence is
counted (padding is computed too). HFU adds the FLOPs spent recomputing activations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from launcher.config.model import AnyModelConfig, ModelConfig

# Dense (no sparsity) bf16 tensor-core peaks in FLOP/s per device, from the vendors' datasheets.
# First match wins, so specific names come before the names they contain. V100 and T4 have no
# bf16: their fp16 peak is listed. Anything else: set train.peak_flops.
PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    (r"GB200", 2.5e15),
    (r"B200", 2.25e15),
    (r"B100", 1.75e15),
    (r"H200 NVL", 835e12),
    (r"GH200|H200", 989e12),
    (r"H100 NVL", 835e12),
    (r"H100 PCIe", 756e12),
    (r"H100|H800", 989e12),
    (r"A100|A800", 312e12),
    (r"L40S", 362e12),
    (r"L40\b", 181e12),
    (r"L4\b", 121e12),
    (r"A10\b", 125e12),
    (r"V100", 125e12),
    (r"T4\b", 65e12),
    (r"MI325X|MI300X", 1307e12),
    (r"MI250X", 383e12),
    (r"MI250\b", 362e12),
)


def peak_flops_for(device_name: str) -> float | None:
    """The table's peak for a device name such as 'NVIDIA H100 80GB HBM3'; None when unknown."""
    for pattern, peak in PEAK_FLOPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return peak
    return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def non_embedding_params(model: nn.Module) -> int:
    """Parameters outside nn.Embedding modules (a tied output head counts as embedding)."""
    embedding = {
        id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    }
    return sum(p.numel() for p in model.parameters() if id(p) not in embedding)


def flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    """6N + 12·L·H·Q·T: training (forward + backward) FLOPs per token; N non-embedding params."""
    return 6 * n_params + 12 * n_layer * n_head * head_dim * seq_len


def model_flops_per_token(cfg: AnyModelConfig) -> int:
    """Training FLOPs per token of the configured model, from a meta-device copy (no memory, no
    time): 6N + 12LHQT for the built-in GPT; for any other model, 3x its forward FLOPs on one
    sequence (matmuls and attention, counted by FlopCounterMode) over seq_len."""
    from launcher.models import GPT, build_model

    if not isinstance(cfg, ModelConfig):
        return counted_flops_per_token(build_model, cfg)
    with torch.device("meta"):
        n = non_embedding_params(GPT(cfg))
    return flops_per_token(n, cfg.n_layer, cfg.n_head, cfg.d_model // cfg.n_head, cfg.seq_len)


def counted_flops_per_token(build: Any, cfg: AnyModelConfig) -> int:
    """3 x forward FLOPs of one meta-device sequence / seq_len (backward ~ 2 x forward); a model
    the meta device cannot run (one reading a tensor's value) counts 6N, N its non-embedding
    parameters (PaLM's count without the attention term)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = build(cfg)
        inputs = torch.zeros((1, cfg.seq_len), dtype=torch.long)
        try:
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                model(inputs)
        except (NotImplementedError, RuntimeError):
            return 6 * non_embedding_params(model)
    return 3 * int(counter.get_total_flops()) // cfg.seq_len


def utilisation(
    flops_per_token: float, positions_per_s: float, peak_per_device: float, devices: int
) -> float:
    """Achieved FLOP/s over the peak of all devices (MFU with model FLOPs)."""
    return flops_per_token * positions_per_s / (peak_per_device * devices)


@dataclass(frozen=True)
class MfuMeter:
    """MFU of one step or a whole run; None when the device's peak is unknown (CPUs)."""

    flops_per_token: int
    peak_per_device: float | None
    devices: int

    def mfu(self, positions: int, seconds: float) -> float | None:
        if self.peak_per_device is None or seconds <= 0:
            return None
        return utilisation(
            self.flops_per_token, positions / seconds, self.peak_per_device, self.devices
        )


def resolve_peak(override: float | None, device: torch.device) -> float | None:
    """train.peak_flops when set; on a GPU the table's entry; on a CPU None (no meaningful peak)."""
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    return peak_flops_for(device_name(device))


def hardware_utilisation(
    mfu: float | None, recompute: bool, recompute_flops_ratio: float | None
) -> float | None:
    """HFU: MFU with the recomputed forward FLOPs counted too.

    recompute_flops_ratio is the measured training FLOPs with recompute over those without
    (>= 1; launcher/recompute/measure.py reports it). Without recompute HFU equals MFU; with
    recompute and no measured ratio it is unknown (None).
    """
    if mfu is None:
        return None
    if not recompute:
        return mfu
    return mfu * recompute_flops_ratio if recompute_flops_ratio is not None else None
