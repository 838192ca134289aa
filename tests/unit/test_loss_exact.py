"""One process: accumulating micro-batches gives the gradient of one big batch (token-exact)."""

from __future__ import annotations

from pathlib import Path

import torch

from launcher.data import build_dataset
from launcher.training.loss import (
    MicroLossContext,
    StepTokens,
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


def test_micro_loss_scales() -> None:
    tokens = StepTokens((30, 10), positions=100)
    loss_sum = torch.tensor(8.0)
    context = MicroLossContext(scale=2.0 / tokens.total, micro_valid=4, grad_accum=2)
    assert abs(float(token_exact_loss(loss_sum, context)) - 8.0 * 2 / 40) < 1e-7
    assert abs(float(per_micro_batch_mean(loss_sum, context)) - 8.0 / 4 / 2) < 1e-7
    assert tokens.total == 40 and abs(tokens.padding_fraction - 0.6) < 1e-12


def test_the_worker_installs_the_negative_control_only_when_asked() -> None:
    assert loss_function(make_config()) is token_exact_loss
    broken = make_config(debug={"broken_normalization": True})
    assert loss_function(broken) is per_micro_batch_mean
