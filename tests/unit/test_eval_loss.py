"""The validation loss equals one process's token mean over the held-out set, and leaves the RNG
and the model's mode as they were (issue 13, item 10)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from launcher.config.load import to_root_config
from launcher.data.build import build_datasets
from launcher.data.sequence import collate
from launcher.distributed import DistContext
from launcher.models import GPT
from launcher.training.evaluation import Evaluator, due
from launcher.training.loss import token_loss_sum
from tests.data_sources import write_tokens


class StubEngine:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def test_val_loss_is_the_token_mean_over_the_held_out_set(tmp_path: Path) -> None:
    train = write_tokens(tmp_path / "t.bin", 16 * 20 + 1)
    val = write_tokens(tmp_path / "v.bin", 16 * 9 + 5, seed=2)  # 10 windows, the last short
    cfg = to_root_config(
        {
            "data": {"name": "tokens", "path": str(train), "val_path": str(val)},
            "model": {"n_layer": 1, "d_model": 32, "n_head": 2, "seq_len": 16, "dropout": 0.1},
            "batch": {"global_size": 6, "micro_size": 3, "grad_accum": None},
            "eval": {"every": 2, "batches": 5},
        }
    )
    data = build_datasets(cfg.data, 16, 0, 256)
    assert data.val is not None
    torch.manual_seed(0)
    model = GPT(cfg.model)  # type: ignore[arg-type]
    ctx = DistContext(0, 1, 0, torch.device("cpu"))
    evaluator = Evaluator(cfg, ctx, StubEngine(model), data.val)  # type: ignore[arg-type]
    rng = torch.get_rng_state()
    got = evaluator(2)
    assert torch.equal(rng, torch.get_rng_state()) and model.training
    assert evaluator(1) is None and evaluator(3) is None
    model.eval()
    with torch.no_grad():
        inputs, targets = collate([data.val[i] for i in range(len(data.val))])
        want = token_loss_sum(model(inputs), targets) / (targets != -100).sum()
    assert got is not None and abs(got - float(want)) < 1e-6 * abs(float(want))


def test_due_on_every_nth_step_and_the_last() -> None:
    assert [s for s in range(1, 8) if due(s, 3, 7)] == [3, 6, 7]
    assert not any(due(s, 0, 7) for s in range(1, 8))
