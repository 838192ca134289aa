"""model=hf: tiny transformers models built here from configs (nothing downloaded). The launcher
computes the loss from `.logits`; the model's own `labels=` mean is the per-micro-batch bug."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from launcher.config.ac import AcConfig, AcPolicy
from launcher.config.model import UserModelConfig
from launcher.errors import ConfigError
from launcher.models import build_model, find_blocks
from launcher.models.output import LogitsForward
from launcher.recompute.policies import apply_recompute
from launcher.training.loss import MicroLossContext, token_exact_loss, token_loss_sum, valid_tokens
from tests.installed import require

require("transformers")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CONFIGS = {"llama": FIXTURES / "tiny_llama.json", "gpt2": FIXTURES / "tiny_gpt2.json"}
BLOCKS = {"llama": "model.layers", "gpt2": "transformer.h"}


def hf(**kwargs: object) -> UserModelConfig:
    return UserModelConfig(
        _target_="launcher.models.hf.build_hf", name="hf", seq_len=16, kwargs=kwargs
    )


def batch(n: int = 8, t: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (n, t + 1), generator=gen)
    targets = ids[:, 1:].clone()
    lengths = torch.tensor([16, 3, 9, 1, 12, 5, 16, 2])[:n]  # uneven valid tokens per sample
    targets[torch.arange(t)[None, :] >= lengths[:, None]] = -100
    return ids[:, :-1], targets


def grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_split_gradient_equals_whole_batch_and_own_mean_differs(kind: str) -> None:
    torch.manual_seed(0)
    model = build_model(hf(config=str(CONFIGS[kind])))
    assert find_blocks(model).path == BLOCKS[kind]
    inputs, targets = batch()
    total = valid_tokens(targets)
    (token_loss_sum(model(inputs), targets) / total).backward()
    whole = grads(model)
    model.zero_grad()
    for part in range(4):  # dp 2 x grad_accum 2, micro-batches of 2, as the loop does it
        sl = slice(2 * part, 2 * part + 2)
        context = MicroLossContext(1.0 / total, valid_tokens(targets[sl]), 2)
        token_exact_loss(token_loss_sum(model(inputs[sl]), targets[sl]), context).backward()
    torch.testing.assert_close(grads(model), whole, rtol=1e-5, atol=1e-7)
    # The model's own loss: a mean per micro-batch, averaged over micro-batches (and ranks).
    model.zero_grad()
    raw = model.forward.inner if isinstance(model.forward, LogitsForward) else model.forward
    for part in range(4):
        sl = slice(2 * part, 2 * part + 2)
        labels = torch.cat([inputs[sl, :1], targets[sl]], dim=1)[:, :-1]  # HF shifts labels itself
        (raw(input_ids=inputs[sl], labels=labels).loss / 4).backward()
    own = grads(model)
    assert float((own - whole).norm() / whole.norm()) > 1e-2


def test_recompute_on_hf_blocks_keeps_gradients_and_names() -> None:
    inputs, targets = batch(4)
    results = {}
    for policy in (AcPolicy.none, AcPolicy.full, AcPolicy.selective):
        torch.manual_seed(0)
        model = build_model(hf(config=str(CONFIGS["llama"])))
        apply_recompute(model, AcConfig(policy=policy))
        token_loss_sum(model(inputs), targets).backward()
        results[policy] = (list(model.state_dict()), grads(model))
    for policy in (AcPolicy.full, AcPolicy.selective):
        assert results[policy][0] == results[AcPolicy.none][0]
        torch.testing.assert_close(results[policy][1], results[AcPolicy.none][1])


def test_local_checkpoint_loads_and_errors_name_the_key(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model(hf(config=str(CONFIGS["gpt2"])))
    model.save_pretrained(tmp_path / "ckpt")  # safetensors
    loaded = build_model(hf(path=str(tmp_path / "ckpt")))
    ids = torch.randint(0, 256, (1, 16))
    torch.testing.assert_close(loaded(ids), model(ids))
    with pytest.raises(ConfigError, match="exactly one"):
        build_model(hf())
    with pytest.raises(ConfigError, match=r"model.path: .* does not exist"):
        build_model(hf(path=str(tmp_path / "nope")))
    with pytest.raises(ConfigError, match=r"model.seq_len: 128 is longer"):
        build_model(
            UserModelConfig(
                _target_="launcher.models.hf.build_hf",
                seq_len=128,
                kwargs={"config": str(CONFIGS["gpt2"])},
            )
        )
