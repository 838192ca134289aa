"""One process: accumulating micro-batches gives the gradient of one big batch (token-exact)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from launcher.data import build_dataset
from launcher.training.loss import (
    MicroLossContext,
    StepCounts,
    per_micro_batch_mean,
    token_exact_loss,
)
from launcher.worker.debug import loss_function
from tests.harness import make_config, one_step_gradient, relative_error

TOLERANCE = 1e-5


def test_uneven_token_counts_in_the_batch(tmp_path: Path) -> None:
    cfg = make_config(batch={"global_size": 16})
    ds = build_dataset(cfg.data, cfg.model.seq_len, 0)
    counts = [int((ds[i].targets != -100).sum()) for i in range(16)]
    assert len(set(counts)) > 2  # the test below would be blind with equal counts


def test_accumulation_equals_one_big_batch(tmp_path: Path) -> None:
    big = one_step_gradient(make_config(batch={"global_size": 16, "grad_accum": 1}), tmp_path)
    accumulated = one_step_gradient(
        make_config(batch={"global_size": 16, "grad_accum": 4}), tmp_path
    )
    assert relative_error(accumulated, big) < TOLERANCE


def test_negative_control_per_micro_batch_mean_differs(tmp_path: Path) -> None:
    big = one_step_gradient(make_config(batch={"global_size": 16, "grad_accum": 1}), tmp_path)
    wrong = one_step_gradient(
        make_config(batch={"global_size": 16, "grad_accum": 4}),
        tmp_path,
        loss_fn=per_micro_batch_mean,
    )
    assert relative_error(wrong, big) > 100 * TOLERANCE


def test_micro_losses_add_up_to_the_global_token_mean() -> None:
    """What the loop backpropagates per micro-batch (launcher/training/loop.py), the scale taken
    from the step's counts: summed over the micro-batches it is grad_divisor x the mean over all
    the step's valid tokens, whatever their uneven split; the negative control is not."""
    micro_sums = [torch.tensor(12.0), torch.tensor(3.0), torch.tensor(9.0)]
    micro_valid = (30, 4, 6)
    grad_divisor = 2.0  # what undoes DDP's average over 2 ranks
    counts = StepCounts(sum(micro_valid), stop=False, carry=None, device=torch.device("cpu"))
    contexts = [
        MicroLossContext(counts.scale(grad_divisor), valid, len(micro_valid))
        for valid in micro_valid
    ]
    exact = sum(float(token_exact_loss(s, c)) for s, c in zip(micro_sums, contexts, strict=True))
    assert exact == pytest.approx(grad_divisor * 24.0 / 40, rel=1e-7)
    wrong = sum(
        float(per_micro_batch_mean(s, c)) for s, c in zip(micro_sums, contexts, strict=True)
    )
    assert wrong == pytest.approx((12 / 30 + 3 / 4 + 9 / 6) / 3, rel=1e-7)  # 0.88, not 0.6
    tokens, _ = counts.read(positions=100)
    assert tokens.total == 40 and tokens.padding_fraction == pytest.approx(0.6)
    # A step without valid tokens: every sum is 0, the scale is finite (nothing is NaN).
    empty = StepCounts(0, stop=False, carry=None, device=torch.device("cpu"))
    assert empty.scale(grad_divisor) == grad_divisor


def test_the_worker_installs_the_negative_control_only_when_asked() -> None:
    assert loss_function(make_config()) is token_exact_loss
    broken = make_config(debug={"broken_normalization": True})
    assert loss_function(broken) is per_micro_batch_mean
