"""The user's own model by `_target_`: config, instantiation, blocks found, recompute on any block
list, classifier targets, the plan's checks and FLOPs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from launcher.config.ac import AcConfig, AcPolicy
from launcher.config.load import to_root_config, to_yaml
from launcher.config.model import ModelConfig, UserModelConfig
from launcher.config.overrides import check_overrides
from launcher.engines.fsdp import shard_units
from launcher.errors import ConfigError
from launcher.models import GPT, build_model, find_blocks, require_blocks
from launcher.plan import model_info
from launcher.recompute.policies import apply_recompute
from launcher.tracking.flops import model_flops_per_token
from launcher.training.loss import (
    MicroLossContext,
    token_exact_loss,
    token_loss_sum,
    valid_tokens,
)
from launcher.worker.run import warn_batch_dependent_layers
from tests.fixtures.models import BNClassifier, NoBlocks, TinyLM

CONF = Path(__file__).resolve().parents[2] / "conf"
FIX = "tests.fixtures.models"


def user_cfg(target: str = f"{FIX}.TinyLM", **model: object) -> dict[str, object]:
    return {
        "model": {"_target_": target, "seq_len": 24, **model},
        "wandb": {"mode": "disabled"},
        "batch": {"global_size": 8},
    }


def test_user_model_section_keeps_its_own_keys_and_round_trips() -> None:
    cfg = to_root_config(user_cfg(d_model=16, n_layer=2))
    assert isinstance(cfg.model, UserModelConfig)
    assert cfg.model.kwargs == {"d_model": 16, "n_layer": 2}
    text = to_yaml(cfg)
    assert "  d_model: 16" in text and "kwargs" not in text  # recorded flat, as written
    again = to_root_config(OmegaConf.create(text))
    assert again.model == cfg.model
    gpt = to_root_config({"model": {"n_layer": 3}})
    assert isinstance(gpt.model, ModelConfig) and gpt.model.n_layer == 3
    with pytest.raises(ConfigError, match=r"model\.n_layr"):
        to_root_config({"model": {"n_layr": 3}})


def test_overrides_open_for_a_user_model_only() -> None:
    check_overrides(["model=custom", f"model._target_={FIX}.TinyLM", "+model.width=3"], CONF)
    check_overrides(["model=hf", "model.config=x.json"], CONF)
    with pytest.raises(ConfigError, match=r"model\.n_layr"):
        check_overrides(["model=tiny", "model.n_layr=3"], CONF)


def test_instantiate_class_function_and_output_object() -> None:
    torch.manual_seed(0)
    a = build_model(UserModelConfig(_target_=f"{FIX}.TinyLM", seq_len=8, kwargs={"d_model": 16}))
    torch.manual_seed(0)
    b = build_model(UserModelConfig(_target_=f"{FIX}.WrappedLM", seq_len=8, kwargs={"d_model": 16}))
    ids = torch.randint(0, 256, (2, 8))
    assert torch.equal(a(ids), b(ids))  # `.logits` unwrapped; same seed, same weights
    assert a.pos.shape[0] == 8  # seq_len passed: the target takes it
    net = build_model(UserModelConfig(_target_=f"{FIX}.build_net", kwargs={"n_layer": 1}))
    assert isinstance(net, TinyLM) and len(net.trunk.layers) == 1
    with pytest.raises(ConfigError, match=r"model\._target_: 'no\.such\.Net' does not import"):
        build_model(UserModelConfig(_target_="no.such.Net"))


def test_blocks_found_named_or_refused() -> None:
    assert find_blocks(TinyLM()).path == "trunk.layers"  # longest uniform list, not trunk.extra
    assert find_blocks(GPT(ModelConfig(n_layer=2))).path == "blocks"
    assert find_blocks(TinyLM(), "trunk.extra").path == "trunk.extra"
    assert find_blocks(NoBlocks()) is None
    with pytest.raises(ConfigError, match=r"model.blocks: 'trunk.nope'"):
        find_blocks(TinyLM(), "trunk.nope")
    with pytest.raises(ConfigError, match=r"model.blocks: engine=fsdp"):
        shard_units(NoBlocks())
    with pytest.raises(ConfigError, match="ac=full needs"):
        apply_recompute(NoBlocks(), AcConfig(policy=AcPolicy.full))
    model = TinyLM(n_layer=3)
    units = shard_units(model)
    assert units[:-1] == list(model.trunk.layers) and units[-1] is model
    assert len(require_blocks(model, None, "x")) == 3


def _grads(policy: AcPolicy, offload: bool = False) -> tuple[list[str], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = TinyLM(d_model=16, n_layer=4, seq_len=12, dropout=0.1)
    apply_recompute(model, AcConfig(policy=policy, every_n=2, offload=offload))
    ids = torch.randint(0, 256, (3, 12))
    torch.manual_seed(1)
    token_loss_sum(model(ids), ids).backward()
    return list(model.state_dict()), [p.grad for p in model.parameters()]  # type: ignore[misc]


@pytest.mark.parametrize("policy", [p for p in AcPolicy.granularities() if p != AcPolicy.none])
def test_recompute_on_a_user_model_keeps_gradients_and_names(policy: AcPolicy) -> None:
    keys, reference = _grads(AcPolicy.none)
    for offload in (False, True):
        got_keys, grads = _grads(policy, offload)
        assert got_keys == keys
        for a, b in zip(grads, reference, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_classifier_targets_are_exact_across_splits() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5))
    x, y = torch.randn(8, 6), torch.randint(0, 5, (8,))
    y[[1, 2, 6]] = -100  # unlabelled samples: out of the loss and of the denominator
    assert valid_tokens(y) == 5
    (token_loss_sum(model(x), y) / valid_tokens(y)).backward()
    whole = model[0].weight.grad.clone()
    model.zero_grad()
    total = valid_tokens(y)
    for part in range(4):  # dp 2 x accumulation 2, micro-batches of 2
        sl = slice(2 * part, 2 * part + 2)
        context = MicroLossContext(1.0 / total, valid_tokens(y[sl]), 2)
        token_exact_loss(token_loss_sum(model(x[sl]), y[sl]), context).backward()
    torch.testing.assert_close(model[0].weight.grad, whole)
    with pytest.raises(ValueError, match="do not match"):
        token_loss_sum(torch.zeros(8, 3, 5), y)


def test_batch_norm_classifier_warned_under_accumulation() -> None:
    assert warn_batch_dependent_layers(BNClassifier(), micro_size=2, global_size=8)
    assert not warn_batch_dependent_layers(BNClassifier(), micro_size=8, global_size=8)


def test_plan_checks_refuse_bad_models() -> None:
    info = model_info(to_root_config(user_cfg(d_model=16)))
    assert info.parameters == sum(p.numel() for p in TinyLM(d_model=16, seq_len=24).parameters())
    assert info.blocks is not None and info.vocab == 256
    with pytest.raises(ConfigError, match="returned dict, not logits"):
        model_info(to_root_config(user_cfg(f"{FIX}.NotLogits")))
    with pytest.raises(ConfigError, match="logits have 100 entries, but the data has target id"):
        model_info(to_root_config(user_cfg(vocab_size=100)))
    with pytest.raises(ConfigError, match=r"model.blocks: ac=full"):
        model_info(to_root_config({**user_cfg(f"{FIX}.NoBlocks"), "ac": {"policy": "full"}}))


def test_flops_counted_on_the_model_built() -> None:
    cfg = UserModelConfig(_target_=f"{FIX}.TinyLM", seq_len=24, kwargs={"d_model": 16})
    flops = model_flops_per_token(cfg)
    # 3 x forward matmuls per token at least: 2 x (non-embedding weights) x 3.
    model = TinyLM(d_model=16, seq_len=24)
    weights = sum(p.numel() for n, p in model.named_parameters() if n.endswith("weight"))
    assert flops >= 6 * (weights - model.embed.weight.numel() - 2 * 16 * 4)
