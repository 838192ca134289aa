"""Measured activation bytes and recompute FLOPs per policy, asserted as counts (never times)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from launcher.config.ac import AcConfig, AcPolicy
from launcher.config.load import to_root_config
from launcher.config.model import ModelConfig
from launcher.models import GPT
from launcher.recompute.measure import (
    ActivationTracker,
    MicroBatchCost,
    activation_report,
    count_flops,
    flop_counter,
    measure_activations,
    measure_micro_batch,
)
from launcher.recompute.policies import apply_recompute, build_runner

BATCH, SEQ, WIDTH = 4, 24, 64
BLOCK_INPUT_BYTES = BATCH * SEQ * WIDTH * 4  # one fp32 residual-stream tensor


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def gpt(n_layer: int, dropout: float = 0.0, d_model: int = WIDTH) -> GPT:
    torch.manual_seed(0)
    model = GPT(
        ModelConfig(n_layer=n_layer, n_head=2, d_model=d_model, seq_len=SEQ, dropout=dropout)
    )
    model.train()
    return model


def batch(size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, 256, (size, SEQ), generator=g)
    return inputs, torch.randint(0, 256, (size, SEQ), generator=g)


def cost(model: GPT, policy: AcPolicy, every_n: int = 2) -> MicroBatchCost:
    model.run_blocks = build_runner(AcConfig(policy=policy, every_n=every_n), model.blocks)
    model.zero_grad(set_to_none=True)
    return measure_micro_batch(model, *batch())


def test_tracker_counts_what_ops_create_and_forgets_what_is_freed() -> None:
    layer = nn.Linear(8, 16)
    x = torch.randn(4, 8)
    tracker = ActivationTracker([*layer.parameters(), x])
    with tracker:
        y = torch.relu(layer(x))  # the linear's output dies after relu; relu keeps its own
        assert tracker.live_bytes == 4 * 16 * 4  # parameters, the input and weight.t() never count
        assert tracker.peak_bytes == 2 * 4 * 16 * 4
        del y
        assert tracker.live_bytes == 0


def test_full_keeps_one_block_input_per_block() -> None:
    two, four = cost(gpt(2), AcPolicy.full), cost(gpt(4), AcPolicy.full)
    assert four.activation_bytes - two.activation_bytes == 2 * BLOCK_INPUT_BYTES
    none = cost(gpt(4), AcPolicy.none)
    # Without recompute a block keeps about 16 such tensors.
    per_block = (none.activation_bytes - four.activation_bytes) / 4 / BLOCK_INPUT_BYTES
    assert 14 < per_block < 17
    sqrt = cost(gpt(4), AcPolicy.sqrt)  # 2 segments of 2 blocks: 2 inputs kept, not 4
    assert four.activation_bytes - sqrt.activation_bytes == 2 * BLOCK_INPUT_BYTES


def test_full_flops_ratio_with_dropout() -> None:
    model = gpt(4, dropout=0.1)
    ratio = cost(model, AcPolicy.full).flops / cost(model, AcPolicy.none).flops
    assert 1.25 <= ratio <= 1.34


def test_full_recomputes_each_block_forward_but_its_last_projection_without_dropout() -> None:
    """With dropout 0 nothing after a block's MLP down-projection saves a tensor, so torch's
    checkpoint early stop never reruns it: exactly that matmul is missing from the recompute."""
    model = gpt(4)
    extra = cost(model, AcPolicy.full).flops - cost(model, AcPolicy.none).flops
    with flop_counter() as counter:
        model.blocks[0](torch.randn(BATCH, SEQ, WIDTH))
    block_forward = counter.get_total_flops()
    down_projection = 2 * BATCH * SEQ * (4 * WIDTH) * WIDTH
    assert extra == 4 * (block_forward - down_projection)
    assert 1.15 <= (cost(model, AcPolicy.full).flops / cost(model, AcPolicy.none).flops) <= 1.34


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_selective_saves_a_third_at_no_extra_matmuls(dropout: float) -> None:
    model = gpt(4, dropout=dropout)
    none, selective = cost(model, AcPolicy.none), cost(model, AcPolicy.selective)
    assert selective.activation_bytes <= 0.70 * none.activation_bytes
    assert selective.activation_peak_bytes < none.activation_peak_bytes
    assert selective.flops <= 1.05 * none.flops


def test_every_n_lies_between_none_and_full_and_moves_with_n() -> None:
    model = gpt(8)
    none, full = cost(model, AcPolicy.none), cost(model, AcPolicy.full)
    # n = 1, 2, 3, 4, 8 recompute 8, 4, 3, 2, 1 of the 8 blocks.
    costs = [cost(model, AcPolicy.every_n, every_n=n) for n in (1, 2, 3, 4, 8)]
    assert costs[0] == full
    saved = [c.activation_bytes for c in costs]
    flops = [c.flops for c in costs]
    assert saved == sorted(set(saved)) and flops == sorted(set(flops), reverse=True)
    assert full.activation_bytes <= min(saved) and max(saved) < none.activation_bytes
    assert none.flops < min(flops) and max(flops) <= full.flops


def fitted_exponent(lengths: list[int], values: list[int]) -> float:
    return float(np.polyfit(np.log(lengths), np.log(values), 1)[0])


def test_sqrt_peak_grows_like_sqrt_l_and_none_like_l() -> None:
    lengths = [4, 16, 64]
    peaks: dict[AcPolicy, list[int]] = {AcPolicy.none: [], AcPolicy.sqrt: []}
    inputs, targets = batch(size=16)  # enough tokens that weight-gradient temporaries are small
    for n_layer in lengths:
        model = gpt(n_layer)
        for policy, found in peaks.items():
            model.run_blocks = build_runner(AcConfig(policy=policy), model.blocks)
            model.zero_grad(set_to_none=True)
            found.append(measure_activations(model, inputs, targets).peak)
    assert 0.35 <= fitted_exponent(lengths, peaks[AcPolicy.sqrt]) <= 0.65
    assert 0.85 <= fitted_exponent(lengths, peaks[AcPolicy.none]) <= 1.1


def test_counting_flops_leaves_the_gradients_right() -> None:
    model = gpt(2)
    inputs, targets = batch()
    count_flops(model, inputs, targets)
    once = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    count_flops(model, inputs, targets)
    twice = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(torch.allclose(2 * a, b) for a, b in zip(once, twice, strict=True))


@pytest.mark.parametrize("policy", [AcPolicy.none, AcPolicy.sqrt])
def test_activation_report_measures_a_replica_and_touches_nothing(policy: AcPolicy) -> None:
    cfg = to_root_config(
        {
            "model": {"n_layer": 4, "n_head": 2, "d_model": WIDTH, "seq_len": SEQ},
            "ac": {"policy": policy.value},
        }
    )
    torch.manual_seed(0)
    model = GPT(cfg.model)
    apply_recompute(model, cfg.ac)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    report = activation_report(cfg, model, *batch())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert set(report) == {"activation_bytes", "activation_peak_bytes", "recompute_flops_ratio"}
    expected = cost(gpt(4), policy)
    assert report["activation_bytes"] == expected.activation_bytes
    assert report["activation_peak_bytes"] == expected.activation_peak_bytes
    if policy == AcPolicy.none:
        assert report["recompute_flops_ratio"] == 1.0
    else:
        assert report["recompute_flops_ratio"] > 1.2


@pytest.mark.gpu
def test_activation_report_on_gpu_adds_the_cuda_peak() -> None:
    cfg = to_root_config(
        {
            "model": {"n_layer": 4, "n_head": 2, "d_model": WIDTH, "seq_len": SEQ},
            "ac": {"policy": "full"},
        }
    )
    model = GPT(cfg.model).cuda()
    inputs, targets = (t.cuda() for t in batch())
    report = activation_report(cfg, model, inputs, targets)
    assert report["activation_cuda_peak_bytes"] > 0
    assert report["activation_bytes"] < report["activation_peak_bytes"]
