"""ds_config generation: golden files per ZeRO stage, precision sections, engine.extra merging."""

from __future__ import annotations

import json

import pytest

from launcher.config import to_root_config
from launcher.config.root import RootConfig
from launcher.engines.ds_config import build_ds_config
from launcher.errors import ConfigError
from launcher.prepare import check_environment
from tests.goldens import (
    GOLDEN,
    ZERO_STAGES,
    changed_message,
    ds_config_golden,
    ds_config_text,
)


def deepspeed(**sections: dict) -> RootConfig:
    base: dict = {"engine": {"name": "deepspeed"}, "wandb": {"mode": "disabled"}}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return to_root_config(base)


@pytest.mark.parametrize("stage", ZERO_STAGES)
def test_matches_reviewed_golden(stage: int) -> None:
    """Only `python -m tests.goldens --write` rewrites the golden, after a reviewed change."""
    text, path = ds_config_text(stage), ds_config_golden(stage)
    assert text == path.read_text(), changed_message(path, text)


def test_golden_files_are_readable() -> None:
    paths = sorted(GOLDEN.glob("ds_config_stage*.json"))
    assert paths == [ds_config_golden(s) for s in ZERO_STAGES]
    for path in paths:
        text = path.read_text()
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n", path.name


def test_batch_keys_come_from_the_batch_arithmetic() -> None:
    cfg = deepspeed(parallel={"dp": 4}, batch={"global_size": 64, "grad_accum": 8})
    config = build_ds_config(cfg)
    assert config["train_batch_size"] == 64
    assert config["gradient_accumulation_steps"] == 8
    assert config["train_micro_batch_size_per_gpu"] == 2  # 64 / (4 x 8), derived
    assert (
        config["train_batch_size"]
        == config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * 4
    )


def test_precision_sections() -> None:
    bf16 = build_ds_config(deepspeed(train={"precision": "bf16"}))
    assert bf16["bf16"] == {"enabled": True}
    assert bf16["fp16"] == {"enabled": False}
    fp16 = build_ds_config(deepspeed(train={"precision": "fp16"}))
    assert fp16["fp16"]["enabled"] is True
    assert fp16["fp16"]["loss_scale"] == 0  # dynamic loss scaling
    assert fp16["bf16"] == {"enabled": False}


def test_clipping_and_no_optimizer_section() -> None:
    config = build_ds_config(deepspeed(optim={"grad_clip": 0.5}))
    assert config["gradient_clipping"] == 0.5
    # Our AdamW and schedule are passed as client objects, so DeepSpeed gets no sections for them.
    assert "optimizer" not in config
    assert "scheduler" not in config


def test_extra_adds_keys_and_may_repeat_derived_values() -> None:
    extra = {
        "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 5e7},
        "train_batch_size": 32,  # the derived value: allowed, no-op
        "communication_data_type": "fp32",
    }
    config = build_ds_config(deepspeed(engine={"zero_stage": 2, "extra": extra}))
    assert config["zero_optimization"] == {
        "stage": 2,
        "overlap_comm": True,
        "reduce_bucket_size": 5e7,
    }
    assert config["train_batch_size"] == 32
    assert config["communication_data_type"] == "fp32"


@pytest.mark.parametrize(
    ("sections", "extra", "keys"),
    [
        ({}, {"train_batch_size": 64}, ["engine.extra.train_batch_size", "batch.global_size"]),
        (
            {"batch": {"global_size": 16, "micro_size": 4}},
            {"train_micro_batch_size_per_gpu": 8},
            ["engine.extra.train_micro_batch_size_per_gpu", "batch.micro_size"],
        ),
        (
            {"batch": {"global_size": 16, "grad_accum": 2}},
            {"gradient_accumulation_steps": 4},
            ["engine.extra.gradient_accumulation_steps", "batch.grad_accum"],
        ),
        (
            {},
            {"zero_optimization": {"stage": 3}},
            ["engine.extra.zero_optimization.stage", "engine.zero_stage"],
        ),
        ({}, {"zero_optimization": 3}, ["engine.extra.zero_optimization", "engine.zero_stage"]),
        ({}, {"bf16": {"enabled": True}}, ["engine.extra.bf16.enabled", "train.precision"]),
        ({}, {"gradient_clipping": 5.0}, ["engine.extra.gradient_clipping", "optim.grad_clip"]),
    ],
)
def test_contradicting_extra_names_both_keys(sections: dict, extra: dict, keys: list[str]) -> None:
    cfg = deepspeed(**sections, engine={"name": "deepspeed", "extra": extra})
    with pytest.raises(ConfigError) as info:
        build_ds_config(cfg)
    assert info.value.keys == keys
    for key in keys:
        assert key in str(info.value)


@pytest.mark.parametrize("section", ["optimizer", "scheduler"])
def test_extra_cannot_replace_our_optimizer_or_schedule(section: str) -> None:
    cfg = deepspeed(engine={"extra": {section: {"type": "AdamW", "params": {}}}})
    with pytest.raises(ConfigError) as info:
        build_ds_config(cfg)
    assert info.value.keys[0] == f"engine.extra.{section}"
    assert "optim." in str(info.value)


def test_fp16_deepspeed_on_cpu_is_refused_before_launch() -> None:
    cfg = deepspeed(train={"precision": "fp16", "device": "cpu"})
    with pytest.raises(ConfigError) as info:
        check_environment(cfg)
    assert info.value.keys == ["train.precision", "engine"]
    check_environment(deepspeed(train={"precision": "bf16", "device": "cpu"}))
