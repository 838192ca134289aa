"""One process: accumulating micro-batches gives the gradient of one big batch (token-exact)."""

from __future__ import annotations

from pathlib import Path

import torch

from launcher.data import build_dataset
from launcher.training.loss import StepTokens, micro_loss
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
        make_config(
            batch={"global_size": 16, "grad_accum": 4}, debug={"broken_normalization": True}
        ),
        tmp_path,
    )
    assert relative_error(wrong, big) > 100 * TOLERANCE


def test_micro_loss_scales() -> None:
    tokens = StepTokens((30, 10), positions=100)
    loss_sum = torch.tensor(8.0)
    assert abs(float(micro_loss(loss_sum, tokens, grad_divisor=2.0)) - 8.0 * 2 / 40) < 1e-7
    wrong = micro_loss(
        loss_sum, tokens, 2.0, micro_valid=4, grad_accum=2, broken_normalization=True
    )
    assert abs(float(wrong) - 8.0 / 4 / 2) < 1e-7
    assert tokens.total == 40 and abs(tokens.padding_fraction - 0.6) < 1e-12
