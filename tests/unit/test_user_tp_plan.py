"""model.tp_plan, the user's own tensor-parallel plan: every mistake is one ConfigError naming the
key before anything starts (in the config, or on the model the plan builds on the meta device),
with a Fix that works as printed; the memory plan counts each rank's share of the split layers."""

from __future__ import annotations

import pytest
from hydra import compose

from launcher.config import to_root_config
from launcher.config.root import RootConfig
from launcher.errors import ConfigError
from launcher.models.probe import inspect_model
from launcher.models.shape import ModelShape
from launcher.parallel.shape import per_tp_rank
from tests.fixtures.tp_models import PLAN, HeadsLM, plan_override

MODEL = ["model=custom", "model._target_=tests.fixtures.tp_models.HeadsLM", "model.seq_len=32"]


@pytest.fixture(autouse=True)
def _hydra(hydra_conf: None) -> None:
    """Every config here is composed from conf/ with command-line overrides."""


def config(plan: dict[str, str], *extra: str) -> RootConfig:
    overrides = [*MODEL, "parallel.tp=2", "batch.global_size=8", plan_override(plan), *extra]
    return to_root_config(compose(config_name="config", overrides=overrides))


def refusal(plan: dict[str, str], *extra: str) -> ConfigError:
    """The error of the config, or of the model check the plan runs before launch."""
    with pytest.raises(ConfigError) as info:
        inspect_model(config(plan, *extra), None)
    return info.value


def test_the_override_reads_as_the_plan_and_the_model_passes() -> None:
    cfg = config(PLAN)
    assert cfg.model.tp_plan == PLAN  # type: ignore[union-attr]
    assert "tp_plan" not in cfg.model.kwargs  # type: ignore[union-attr]
    assert cfg.parallel.sequence_parallel is False  # null: off for a model's own plan
    inspect_model(cfg, None)


@pytest.mark.parametrize(
    ("change", "extra", "words", "fix"),
    [
        ({"blocks.*.attn.qq": "colwise"}, [], "did you mean blocks.*.attn.q", "blocks.*.attn.q"),
        ({"blocks.*.attn.q": "colwize"}, [], "'colwize' is not", "colwise, rowwise, colwise_rep"),
        ({"nothing.here": "colwise"}, [], "no module of HeadsLM. Fix:", "blocks.*.attn.q"),
        ({"blocks.*.up": "rowwise"}, [], "read by a rowwise layer", "rowwise in model.tp_plan"),
        ({"blocks.*.norm_1": "colwise"}, [], "a LayerNorm", "remove blocks.*.norm_1"),
        ({"blocks.*.norm_1": "sequence"}, [], "built-in GPT's plan only", "remove"),
        ({"head": "colwise"}, [], "logits", "colwise_rep"),
        ({}, ["+model.fixed_heads=true"], "view(b, t, -1, head_dim)", "parallel.tp=1"),
        ({}, ["parallel.tp=4", "+model.n_head=2"], "whole heads", "set parallel.tp=2"),
        ({"embed": "colwise"}, [], "tied weight", "rowwise for the embedding"),
        ({}, ["parallel.sequence_parallel=true"], "sequence parallelism", "=false"),
    ],
    ids=[
        "no_match",
        "unknown_style",
        "no_match_no_suggestion",
        "rowwise_reading_a_whole_input",
        "not_linear",
        "sequence",
        "split_head",
        "fixed_heads",
        "tp_not_dividing_heads",
        "tie_split_apart",
        "sequence_parallel",
    ],
)
def test_each_mistake_is_one_error_naming_the_key(
    change: dict[str, str], extra: list[str], words: str, fix: str | None
) -> None:
    error = refusal({**PLAN, **change}, *extra)
    assert "model.tp_plan" in error.keys or "parallel.sequence_parallel" in error.keys, error
    assert words in str(error), error
    assert error.fix and (fix is None or fix in error.fix), error.fix


def test_tp_not_dividing_names_the_tp_that_does() -> None:
    error = refusal(PLAN, "parallel.tp=3")
    assert error.keys == ["parallel.tp", "model.tp_plan"]
    assert error.fix == "set parallel.tp=2."
    inspect_model(config(PLAN, "parallel.tp=2"), None)  # the fix as printed


def test_the_memory_plan_counts_one_ranks_share() -> None:
    """Split layers divided by tp (the tied embedding and head once), the rest whole."""
    model = HeadsLM(seq_len=32)
    split = {"embed.weight"} | {
        f"blocks.{i}.{name}"
        for i in range(2)
        for name in (
            *(f"attn.{p}.{t}" for p in "qkv" for t in ("weight", "bias")),
            "attn.out.weight",
            "up.weight",
            "up.bias",
            "down.weight",
        )
    }
    named = dict(model.named_parameters())
    assert split <= set(named)
    whole = sum(p.numel() for n, p in named.items() if n not in split)
    expected = whole + sum(named[n].numel() for n in split) // 2
    cfg = config(PLAN)
    info = inspect_model(cfg, None)
    assert info.tp_share is not None and info.parameters == sum(p.numel() for p in named.values())
    sizes = (info.block_parameters, 2, info.largest_parameter, info.parameter_sizes)
    ours = per_tp_rank(cfg, ModelShape(info.parameters, *sizes), info.tp_share)
    assert ours.parameters == expected
    assert ours.block_parameters < info.block_parameters
    one = config({}, "parallel.tp=1")
    assert per_tp_rank(one, ModelShape(info.parameters, *sizes)).parameters == info.parameters
