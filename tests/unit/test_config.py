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
    if group == "data" and option in ("text", "jsonl", "tokens", "hf"):
        extra.append(f"data.path={sample}")
    if group == "data" and option == "hf":
        extra.append(f"data.tokenizer={tmp_path}")
    if group == "data" and option == "custom":
        extra.append("data._target_=my_project.data.make_dataset")
    if group == "model" and option == "custom":
        extra.append("model._target_=tests.fixtures.models.TinyLM")
    override = f"+{group}={option}" if group in ("experiment", "sweep") else f"{group}={option}"
    cfg = compose(config_name="config", overrides=[override, *extra])
    root = to_root_config(cfg)
    assert root.split().global_size > 0


# Issue 17, item 12: nan and inf passed every `> 0` check (comparisons with nan are false) and
# trained to a NaN loss, or failed in torch after config.yaml was written.
@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"optim": {"lr": float("nan")}}, "optim.lr"),
        ({"optim": {"lr": float("inf")}}, "optim.lr"),
        ({"optim": {"grad_clip": float("nan")}}, "optim.grad_clip"),
        ({"optim": {"eps": float("-inf")}}, "optim.eps"),
        ({"model": {"dropout": float("nan")}}, "model.dropout"),
        ({"train": {"peak_flops": float("inf")}}, "train.peak_flops"),
    ],
)
def test_non_finite_numbers_are_refused(overrides: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        to_root_config(overrides)
    assert info.value.keys == [key]
    assert "finite" in info.value.problem and info.value.fix


def test_every_float_field_must_be_finite() -> None:
    """Generic: a float key added later is covered without a check of its own."""
    from launcher.config.schema import schema_keys

    floats = [k for k in schema_keys().values() if k.type is float]
    assert len(floats) >= 8
    for key in floats:
        section, name = key.name.split(".")
        with pytest.raises(ConfigError) as info:
            to_root_config({section: {name: float("nan")}})
        assert info.value.keys == [key.name], key.name


def test_every_key_is_documented() -> None:
    """`launch train --help` shows each key's documentation, read from the dataclass fields."""
    from launcher.config.schema import schema_keys

    keys = schema_keys()
    assert keys["batch.grad_accum"].doc == "Micro-batches per rank per optimizer step."
    assert [k for k in keys.values() if not k.doc] == []


# Issue 17, item 1: overrides are checked against the schema and conf/ before Hydra composes.
@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        ("batch.grad_acum=2", "batch.grad_acum", ["no such key", "did you mean batch.grad_accum?"]),
        ("+batch.grad_acum=2", "batch.grad_acum", ["no such key", "batch.grad_accum"]),
        ("seed=3", "seed", ["did you mean serve.seed or train.seed?"]),
        ("parallel.dp=two", "parallel.dp", ["'two' is not a whole number"]),
        ("train.precision=fp8", "train.precision", ["'fp8'", "fp32, bf16, fp16"]),
        ("model=huge", "model", ["'huge'", "custom, gpt2, hf, small, tiny"]),
        ("model=smal", "model", ["did you mean model=small?"]),
        ("checkpoint.enabled=maybe", "checkpoint.enabled", ["true or false"]),
        ("train.steps=null", "train.steps", ["cannot be null"]),
        ("cluster.setup=abc", "cluster.setup", ["not a list"]),
        ("batch.grad_accum=1,2,x", "batch.grad_accum", ["'x'"]),  # a sweep: every value
        ("hydra.run.dir=", "hydra.run.dir", ["empty"]),
        ("hydra.sweep.dir=''", "hydra.sweep.dir", ["empty"]),
        # an item of data.sources: its own key, not "is not a list"
        ("data.sources=[{name:a,path:a.bin,weight:x}]", "data.sources[0].weight", ["not a number"]),
        (
            "data.sources=[{name:a,path:a.bin,weight:1,bogus:2}]",
            "data.sources[0].bogus",
            ["no such"],
        ),
        ("data.sources=[{name:a,weight:1},web]", "data.sources[1]", ["'web' is not a mapping"]),
    ],
)
def test_bad_overrides_name_the_key_and_the_fix(override: str, key: str, words: list[str]) -> None:
    from launcher.config.overrides import check_overrides

    with pytest.raises(ConfigError) as info:
        check_overrides([override], CONF)
    assert info.value.keys == [key]
    assert info.value.fix and "\n" not in str(info.value)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    "override",
    [
        "+experiment=accumulation",
        "+sweep=accumulation",
        "batch.grad_accum=1,2,4",
        "engine.extra.train_batch_size=8",  # below a mapping: Hydra's to check
        "+engine.extra.foo=1",
        "wandb.tags=[a,b]",
        "batch={global_size: 8}",
        "~batch.micro_size",
        "train.steps=${train.seed}",
        "model=glob(*)",
        "optim.lr=nan",  # a float; refused by the dataclass (finite), not here
        "hydra.run.dir=outputs/x",
        "hydra/launcher=basic",
    ],
)
def test_good_overrides_pass(override: str) -> None:
    from launcher.config.overrides import check_overrides

    check_overrides([override], CONF)


def test_a_user_config_directory_may_add_groups_and_options() -> None:
    from launcher.config.overrides import check_overrides

    check_overrides(["model=mine", "mygroup=x"], CONF, groups_known=False)
    with pytest.raises(ConfigError):
        check_overrides(["batch.grad_acum=2"], CONF, groups_known=False)


def test_hydra_errors_are_translated(hydra_conf) -> None:
    """What only Hydra sees (a user's config directory) still ends as one line naming the key."""
    from hydra.errors import HydraException

    from launcher.config.overrides import translate_hydra_error

    cases = [
        (["model=huge"], "model", "custom, gpt2, hf, small, tiny"),
        (["experiment=accumulation"], "experiment", "+experiment=accumulation"),
        (["engine.extra.foo=1"], "engine.extra.foo", "+engine.extra.foo=1"),
        (["batch.grad_acum=2"], "batch.grad_acum", "batch.grad_accum"),
    ]
    for overrides, key, fix in cases:
        with pytest.raises(HydraException) as info:
            compose(config_name="config", overrides=overrides)
        error = translate_hydra_error(info.value)
        assert error.keys == [key] and fix in error.fix, error
        assert "\n" not in str(error)
