"""Batch-dependent layers see only a micro-batch: warn once, and only when it matters."""

from __future__ import annotations

import logging

import pytest
from torch import nn

from launcher.logs import LOGGER_NAME
from launcher.worker.run import warn_batch_dependent_layers


@pytest.fixture
def propagate_logs():
    logger = logging.getLogger(LOGGER_NAME)
    old = logger.propagate
    logger.propagate = True
    yield
    logger.propagate = old


def test_batchnorm_warns_when_micro_is_smaller(
    caplog: pytest.LogCaptureFixture, propagate_logs: None
) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        assert warn_batch_dependent_layers(model, micro_size=4, global_size=16)
    assert (
        "BatchNorm1d" in caplog.text
        and "SyncBatchNorm" in caplog.text
        and "LayerNorm" in caplog.text
    )


def test_no_warning_without_batchnorm_or_without_splitting() -> None:
    assert not warn_batch_dependent_layers(nn.Sequential(nn.LayerNorm(4)), 4, 16)
    assert not warn_batch_dependent_layers(nn.Sequential(nn.BatchNorm1d(4)), 16, 16)
