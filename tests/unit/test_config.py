"""Config validation names keys; every YAML in conf/ composes and validates."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose

from launcher.config import to_root_config
from launcher.errors import ConfigError

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        (
            {"batch": {"global_size": 10, "micro_size": 3}},
            ["batch.global_size", "batch.micro_size"],
        ),
        ({"batch": {"global_size": -4}}, ["batch.global_size"]),
        ({"parallel": {"dp": 0}}, ["parallel.dp"]),
        ({"parallel": {"dp": 3, "nodes": 2}}, ["parallel.dp", "parallel.nodes"]),
        ({"parallel": {"dp": 2, "nodes": 2}}, ["parallel.nodes", "cluster"]),
        ({"model": {"d_model": 130}}, ["model.d_model", "model.n_head"]),
        ({"model": {"dropout": 1.5}}, ["model.dropout"]),
        ({"ac": {"policy": "sometimes"}}, ["ac.policy"]),
        ({"ac": {"every_n": 0}}, ["ac.every_n"]),
        ({"engine": {"zero_stage": 2}}, ["engine.zero_stage"]),
        ({"engine": {"name": "deepspeed", "zero_stage": 5}}, ["engine.zero_stage"]),
        ({"data": {"name": "text"}}, ["data.path"]),
        ({"data": {"max_len": 20}}, ["data.max_len", "model.seq_len"]),
        ({"train": {"steps": 0}}, ["train.steps"]),
        ({"train": {"precision": "fp8"}}, ["train.precision"]),
        ({"optim": {"lr": -1.0}}, ["optim.lr"]),
        ({"batch": {"size": 8}}, ["batch.size"]),
    ],
)
def test_errors_name_the_key(overrides: dict, keys: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        to_root_config(overrides)
    assert info.value.keys == keys
    for key in keys:
        assert key in str(info.value)


def test_defaults_validate() -> None:
    cfg = to_root_config({})
    assert cfg.split().global_size == cfg.batch.global_size


def _group_options() -> list[tuple[str, str]]:
    return sorted(
        (group.name, option.stem)
        for group in CONF.iterdir()
        if group.is_dir()
        for option in group.glob("*.yaml")
    )


def test_conf_has_the_groups_the_contract_names() -> None:
    options = set(_group_options())
    for needed in [
        ("model", "tiny"),
        ("data", "reverse"),
        ("engine", "ddp"),
        ("ac", "none"),
        ("cluster", "local"),
    ]:
        assert needed in options
    assert len([o for g, o in options if g == "model"]) >= 3


@pytest.mark.parametrize(("group", "option"), _group_options())
def test_every_yaml_composes_and_validates(
    hydra_conf, group: str, option: str, tmp_path: Path
) -> None:
    extra: list[str] = []
    sample = tmp_path / "data.txt"
    sample.write_text('{"prompt": "a", "completion": "b"}\n')
    if group == "data" and option in ("text", "jsonl"):
        extra.append(f"data.path={sample}")
    override = f"+{group}={option}" if group in ("experiment", "sweep") else f"{group}={option}"
    cfg = compose(config_name="config", overrides=[override, *extra])
    root = to_root_config(cfg)
    assert root.split().global_size > 0
