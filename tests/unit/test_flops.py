"""MFU arithmetic: FLOPs per token by hand and by FlopCounterMode, the peak table, HFU."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from launcher.config.model import ModelConfig
from launcher.models import GPT
from launcher.tracking.flops import (
    MfuMeter,
    flops_per_token,
    hardware_utilisation,
    model_flops_per_token,
    non_embedding_params,
    peak_flops_for,
    resolve_peak,
    utilisation,
)

SHAPE = ModelConfig(n_layer=2, n_head=2, d_model=64, seq_len=64)


def test_flops_per_token_by_hand() -> None:
    d = 64
    # One block: ln_1 2d, qkv 3d*d+3d, attn proj d*d+d, ln_2 2d, fc 4d*d+4d, mlp proj 4d*d+d.
    per_block = (
        2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d)
    )
    assert per_block == 12 * d * d + 13 * d == 49_984
    n = 2 * per_block + 2 * d  # + ln_f; embeddings (and the tied head) excluded
    assert n == 100_096
    assert non_embedding_params(GPT(SHAPE)) == n
    # 6N + 12 L H Q T = 600,576 + 12*2*2*32*64 = 600,576 + 98,304
    assert flops_per_token(n, 2, 2, 32, 64) == 698_880
    assert model_flops_per_token(SHAPE) == 698_880


def test_mfu_by_hand() -> None:
    # 698,880 FLOPs/token x 10,000 positions/s over 2 devices of 1 TFLOP/s = 0.0034944
    assert utilisation(698_880, 10_000, 1e12, 2) == pytest.approx(0.0034944)
    meter = MfuMeter(698_880, 1e12, 2)
    assert meter.mfu(positions=5_000, seconds=0.5) == pytest.approx(0.0034944)
    assert MfuMeter(698_880, None, 2).mfu(5_000, 0.5) is None  # CPU: no peak, no MFU
    assert meter.mfu(5_000, 0.0) is None


def test_formula_matches_counted_flops() -> None:
    """FlopCounterMode's count of one forward + backward, against the formula's terms."""
    model = GPT(SHAPE)
    batch, (d, layers, heads, t, v) = 2, (64, 2, 2, 64, SHAPE.vocab)
    idx = torch.randint(0, v, (batch, t))
    # The math backend runs attention as matmuls the counter sees (fused CPU kernels it does not).
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(idx).float().sum().backward()
    # Matmul weights only: 12 d^2 per block; the formula's N also holds biases and LayerNorm
    # weights (13 d per block + 2 d), which cost no matmul, and leaves out the tied head (6 V d).
    biases_and_norms = layers * 13 * d + 2 * d
    head = 6 * v * d
    per_token = model_flops_per_token(SHAPE) - 6 * biases_and_norms + head
    assert per_token == 6 * layers * 12 * d * d + 12 * layers * heads * (d // heads) * t + head
    assert counter.get_total_flops() == per_token * batch * t


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA A10", 125e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA B200", 2.25e15),
        ("AMD Instinct MI300X", 1307e12),
        ("NVIDIA A10G", None),
        ("NVIDIA GeForce GTX 1080", None),
    ],
)
def test_peak_table(name: str, peak: float | None) -> None:
    assert peak_flops_for(name) == peak


def test_peak_override_and_cpu() -> None:
    cpu = torch.device("cpu")
    assert resolve_peak(None, cpu) is None
    assert resolve_peak(2e12, cpu) == 2e12  # train.peak_flops: the user's number, used as given


def test_hfu() -> None:
    assert hardware_utilisation(0.4, recompute=False, recompute_flops_ratio=None) == 0.4
    assert hardware_utilisation(0.4, recompute=True, recompute_flops_ratio=1.25) == pytest.approx(
        0.5
    )
    assert hardware_utilisation(0.4, recompute=True, recompute_flops_ratio=None) is None
    assert hardware_utilisation(None, recompute=True, recompute_flops_ratio=1.25) is None
