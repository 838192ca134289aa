"""Recompute policies: the segment plans, exact gradients under every policy (with and without
dropout), unchanged parameter names, evaluation, offload, and FSDP2 sharding after a policy."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from launcher.config.ac import AcConfig, AcPolicy
from launcher.config.model import ModelConfig
from launcher.models import GPT
from launcher.recompute.policies import apply_recompute, build_runner
from launcher.recompute.segments import Segment, SegmentMode, plan_segments, sqrt_segment_size
from launcher.training.loss import token_loss_sum

POLICIES = AcPolicy.granularities()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_gpt(n_layer: int = 4, dropout: float = 0.0, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(ModelConfig(n_layer=n_layer, n_head=2, d_model=64, seq_len=24, dropout=dropout))
    model.train()
    return model


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, 256, (4, 24), generator=g)
    targets = torch.randint(0, 256, (4, 24), generator=g)
    targets[0, :5] = -100  # some ignored targets, as in the real data
    return inputs, targets


def loss_and_grads(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, seed: int = 7
) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout masks for every policy
    loss = token_loss_sum(model(inputs), targets)
    loss.backward()
    return float(loss.detach()), {
        n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None
    }


def max_rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)) for k in a)


# --- the plans ---------------------------------------------------------------------------------


def covers(segments: tuple[Segment, ...], n: int) -> bool:
    return [i for s in segments for i in range(s.start, s.stop)] == list(range(n))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("n_layer", [1, 2, 5, 12, 64])
def test_every_plan_covers_each_block_once_in_order(policy: AcPolicy, n_layer: int) -> None:
    assert covers(plan_segments(policy, n_layer, every_n=3), n_layer)


def test_none_full_selective_plans() -> None:
    assert plan_segments(AcPolicy.none, 6) == (Segment(0, 6, SegmentMode.keep),)
    assert plan_segments(AcPolicy.full, 3) == tuple(
        Segment(i, i + 1, SegmentMode.full) for i in range(3)
    )
    assert {s.mode for s in plan_segments(AcPolicy.selective, 4)} == {SegmentMode.selective}
    assert all(s.size == 1 for s in plan_segments(AcPolicy.selective, 4))


def test_every_n_recomputes_blocks_0_n_2n() -> None:
    segs = plan_segments(AcPolicy.every_n, 8, every_n=3)
    assert [s.start for s in segs if s.mode == SegmentMode.full] == [0, 3, 6]
    assert [(s.start, s.stop) for s in segs if s.mode == SegmentMode.keep] == [
        (1, 3),
        (4, 6),
        (7, 8),
    ]
    assert plan_segments(AcPolicy.every_n, 5, every_n=1) == plan_segments(AcPolicy.full, 5)
    counts = [
        sum(s.mode == SegmentMode.full for s in plan_segments(AcPolicy.every_n, 12, every_n=n))
        for n in range(1, 14)
    ]
    assert counts == sorted(counts, reverse=True) and counts[0] == 12 and counts[-1] == 1


@pytest.mark.parametrize(
    ("n_layer", "size", "count"),
    [(1, 1, 1), (4, 2, 2), (12, 3, 4), (16, 4, 4), (64, 8, 8), (10, 3, 4)],
)
def test_sqrt_groups_about_sqrt_l_blocks(n_layer: int, size: int, count: int) -> None:
    segs = plan_segments(AcPolicy.sqrt, n_layer)
    assert sqrt_segment_size(n_layer) == size
    assert len(segs) == count and all(s.mode == SegmentMode.full for s in segs)
    assert max(s.size for s in segs) == size


# --- exactness -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_gradients_equal_without_recompute(dropout: float) -> None:
    model = tiny_gpt(n_layer=4, dropout=dropout)
    inputs, targets = batch()
    reference_loss, reference = loss_and_grads(model, inputs, targets)
    for policy in POLICIES:
        model.run_blocks = build_runner(AcConfig(policy=policy, every_n=2), model.blocks)
        loss, grads = loss_and_grads(model, inputs, targets)
        assert loss == pytest.approx(reference_loss, rel=1e-6), policy
        assert max_rel(grads, reference) <= 1e-6, policy


def test_dropout_is_active_in_the_exactness_check() -> None:
    # The dropout test above would prove nothing if both runs drew no masks.
    model = tiny_gpt(dropout=0.1)
    inputs, targets = batch()
    _, first = loss_and_grads(model, inputs, targets, seed=7)
    _, second = loss_and_grads(model, inputs, targets, seed=8)
    assert max_rel(first, second) > 1e-3


class InPlaceBiasLinear(nn.Linear):
    """DeepSpeed ZeRO-3's linear: matmul, then the bias added in place to the matmul output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.matmul(self.weight.t())
        out += self.bias
        return out


def test_selective_never_adds_an_in_place_bias_twice() -> None:
    torch.manual_seed(0)
    blocks = nn.ModuleList(
        nn.Sequential(
            InPlaceBiasLinear(16, 64), nn.GELU(), InPlaceBiasLinear(64, 16), nn.LayerNorm(16)
        )
        for _ in range(2)
    )
    for module in blocks.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.bias)  # zero biases (GPT's init) would hide a double add
    x = torch.randn(4, 6, 16)

    def grads(policy: AcPolicy) -> dict[str, torch.Tensor]:
        blocks.zero_grad(set_to_none=True)
        build_runner(AcConfig(policy=policy), blocks)(blocks, x).square().sum().backward()
        return {n: p.grad.clone() for n, p in blocks.named_parameters() if p.grad is not None}

    assert max_rel(grads(AcPolicy.selective), grads(AcPolicy.none)) <= 1e-6


@pytest.mark.parametrize("policy", POLICIES)
def test_state_dict_keys_do_not_depend_on_the_policy(policy: AcPolicy) -> None:
    plain = tiny_gpt()
    wrapped = tiny_gpt(seed=3)
    apply_recompute(wrapped, AcConfig(policy=policy))
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in wrapped.named_parameters()] == [n for n, _ in plain.named_parameters()]
    wrapped.load_state_dict(plain.state_dict())  # a checkpoint loads across ac settings
    inputs, _ = batch()
    assert torch.equal(wrapped(inputs), plain(inputs))


def test_evaluation_without_grad_runs_plainly() -> None:
    model = tiny_gpt()
    inputs, _ = batch()
    expected = model(inputs).detach()
    apply_recompute(model, AcConfig(policy=AcPolicy.full))
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(inputs), expected)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def saved_outside(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> int:
    """Tensors autograd saves for backward that reach hooks installed around the model. An
    offload context inside the model (save_on_cpu) is innermost and would take them first."""
    seen = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal seen
        seen += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = token_loss_sum(model(inputs), targets)
    loss.backward()
    return seen


def test_offload_on_cpu_is_a_notice_logged_once() -> None:
    """On the CPU, activations already live in host memory: ac.offload installs no offload
    context (the graph saves what it saves without it) and says so once. That gradients survive
    an offload is the GPU test's job (test_offload_on_gpu_keeps_gradients)."""
    from launcher.recompute import policies as recompute

    recompute._offload_notice.cache_clear()
    logger = logging.getLogger("launcher.recompute")
    records, level = _Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    try:
        model = tiny_gpt(n_layer=2)
        inputs, targets = batch()
        plain = saved_outside(model, inputs, targets)
        apply_recompute(model, AcConfig(policy=AcPolicy.none, offload=True))
        offloaded = [saved_outside(model, inputs, targets) for _ in range(3)]
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert plain > 0 and offloaded == [plain] * 3
    assert sum("ac.offload=true" in m and "nothing to offload" in m for m in records.messages) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("policy", [AcPolicy.none, AcPolicy.full, AcPolicy.selective])
def test_offload_on_gpu_keeps_gradients(policy: AcPolicy) -> None:
    model = tiny_gpt(dropout=0.1).cuda()
    inputs, targets = (t.cuda() for t in batch())
    _, reference = loss_and_grads(model, inputs, targets)
    model.run_blocks = build_runner(AcConfig(policy=policy, offload=True), model.blocks)
    _, grads = loss_and_grads(model, inputs, targets)
    assert max_rel(grads, reference) <= 1e-6


# --- composition with FSDP2 ----------------------------------------------------------------------


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


@pytest.mark.parametrize("policy", [AcPolicy.full, AcPolicy.sqrt, AcPolicy.selective])
def test_fully_shard_after_the_policy(one_rank_group: None, policy: AcPolicy) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    plain = tiny_gpt(dropout=0.1)
    inputs, targets = batch()
    reference_loss, reference = loss_and_grads(plain, inputs, targets)

    sharded = tiny_gpt(dropout=0.1)
    apply_recompute(sharded, AcConfig(policy=policy))  # the policy first, then the engine
    mesh = init_device_mesh("cpu", (1,))
    for unit in [*sharded.blocks, sharded]:
        fully_shard(unit, mesh=mesh)
    loss, grads = loss_and_grads(sharded, inputs, targets)
    full = {k: g.full_tensor() if isinstance(g, DTensor) else g for k, g in grads.items()}
    assert loss == pytest.approx(reference_loss, rel=1e-6)
    assert max_rel(full, reference) <= 1e-6
