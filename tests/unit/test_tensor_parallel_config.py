"""parallel.tp and parallel.sequence_parallel: the world is dp x tp, a tp group stays in a node,
and every layout or feature that does not compose with tensor parallelism is one ConfigError
before launch, naming the keys, whose Fix works as printed."""

from __future__ import annotations

import pytest
import torch
from hydra import compose

from launcher.config import to_root_config
from launcher.config.root import RootConfig
from launcher.distributed import DistContext, check_world_size
from launcher.errors import ConfigError
from launcher.models.shape import ModelShape
from launcher.parallel.shape import per_tp_rank
from launcher.training.loop import data_ranks

TINY = ["model.n_layer=2", "model.n_head=4", "model.d_model=32", "model.seq_len=24"]


@pytest.fixture(autouse=True)
def _hydra(hydra_conf: None) -> None:
    """Every config here is composed from conf/ with command-line overrides."""


def config(overrides: list[str]) -> RootConfig:
    """The config `launch` would run for these overrides (the built-in GPT made small unless
    another model is named)."""
    small = [] if any(o.startswith("model=") for o in overrides) else TINY
    return to_root_config(compose(config_name="config", overrides=[*small, *overrides]))


def refusal(overrides: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config(overrides)
    return info.value


def test_world_is_dp_times_tp_and_sequence_parallel_defaults_on() -> None:
    cfg = config(["parallel.dp=2", "parallel.tp=2", "batch.global_size=8"])
    assert (cfg.parallel.world, cfg.parallel.ranks_per_node, cfg.split().dp) == (4, 4, 2)
    assert cfg.parallel.sequence_sharded
    off = config(["parallel.tp=2", "parallel.sequence_parallel=false"])
    assert not off.parallel.sequence_sharded
    assert not config([]).parallel.sequence_sharded


def test_tp_not_dividing_the_heads_is_refused_with_a_fix_that_works() -> None:
    error = refusal(["parallel.tp=3"])  # 4 heads
    assert error.keys == ["parallel.tp", "model.n_head"]
    assert "n_head=4" in error.problem
    assert error.fix.startswith("set parallel.tp=2")
    config(["parallel.tp=2"])  # the fix as printed


@pytest.mark.parametrize(
    ("overrides", "keys", "fix"),
    [
        (["engine=deepspeed"], ["parallel.tp", "engine"], "engine=fsdp"),
        (["model.seq_len=25"], ["parallel.tp", "model.seq_len"], "model.seq_len=26"),
        (["model.vocab_size=257"], ["parallel.tp", "model.vocab_size"], "model.vocab_size=258"),
        (["parallel.dp=2", "parallel.nodes=4", "cluster=slurm"], ["parallel.tp"], None),
    ],
    ids=["deepspeed", "seq_len", "vocab", "group_across_nodes"],
)
def test_what_does_not_compose_is_refused_naming_the_key(
    overrides: list[str], keys: list[str], fix: str | None
) -> None:
    error = refusal(["parallel.tp=2", *overrides])
    assert all(key in error.keys for key in keys), error.keys
    assert error.fix
    if fix is not None:
        assert fix in error.fix
        fixed = [o for o in overrides if o.split("=")[0] != fix.split("=")[0]]
        config(["parallel.tp=2", *fixed, fix])  # the fix as printed


def test_sequence_parallel_without_tp_is_refused() -> None:
    error = refusal(["parallel.sequence_parallel=true"])
    assert error.keys == ["parallel.sequence_parallel", "parallel.tp"]


def test_a_job_with_other_ranks_than_dp_times_tp_is_refused_at_runtime() -> None:
    ctx = DistContext(0, 2, 0, torch.device("cpu"))
    check_world_size(ctx, 1, 1, 2)  # dp 1 x tp 2: these two ranks
    with pytest.raises(ConfigError) as info:
        check_world_size(ctx, 2, 1, 2)
    assert "parallel.tp" in info.value.keys and "dp=2 x tp=2" in info.value.problem


def test_a_tp_group_counts_its_tokens_once() -> None:
    """Ranks (dp, tp) = (2, 2): rank r trains stream r // 2; one rank per group counts."""
    layout = [data_ranks(DistContext(r, 4, r, torch.device("cpu"), tp=2)) for r in range(4)]
    assert [(d.index, d.size, d.counts) for d in layout] == [
        (0, 2, True),
        (0, 2, False),
        (1, 2, True),
        (1, 2, False),
    ]
    broken = data_ranks(DistContext(1, 4, 1, torch.device("cpu"), tp=2), broken_tp_count=True)
    assert (broken.index, broken.size, broken.counts) == (1, 4, True)


def test_per_rank_shape_divides_split_layers_and_keeps_norms_whole() -> None:
    cfg = config(["parallel.tp=2"])
    d, blocks = 32, 2
    norms_and_biases = 6 * d
    block = 12 * d * d + 13 * d
    shape = ModelShape(blocks * block + 256 * d + 24 * d + 2 * d, block, blocks, 256 * d)
    ours = per_tp_rank(cfg, shape)
    assert ours.block_parameters == (block - norms_and_biases) // 2 + norms_and_biases
    assert ours.parameters == (shape.parameters - blocks * norms_and_biases - 2 * d) // 2 + (
        blocks * norms_and_biases + 2 * d
    )
    assert per_tp_rank(config([]), shape) == shape


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("adapter=lora", "adapter"),
        ("ac=selective", "ac"),
    ],
)
def test_features_not_composed_yet_are_refused_before_launch(override: str, key: str) -> None:
    error = refusal(["parallel.tp=2", override])
    assert error.keys == [key, "parallel.tp"]
    assert "parallel.tp=1" in error.fix


def test_a_user_model_without_a_plan_and_hf_have_no_sequence_parallelism() -> None:
    custom = refusal(
        ["parallel.tp=2", "model=custom", "model._target_=tests.fixtures.models.TinyLM"]
    )
    assert custom.keys == ["parallel.tp", "model.tp_plan"]
    assert "add model.tp_plan" in custom.fix and "parallel.tp=1" in custom.fix
    hf = ["model=hf", "model.config=tests/fixtures/tiny_llama.json", "parallel.tp=2"]
    error = refusal([*hf, "parallel.sequence_parallel=true"])
    assert error.keys == ["parallel.sequence_parallel", "model"]
    assert config(hf).parallel.sequence_parallel is False  # null resolves to off


DATA = "examples/own_project/data"
DOCUMENTS = ["data=hf", f"data.path={DATA}/corpus.jsonl", f"data.tokenizer={DATA}/tokenizer"]


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        ([], "data.cross_document_attention", "data.cross_document_attention=true"),
        (
            ["data.packing=true"],
            "data.packing",
            "data.packing=false data.cross_document_attention=true",
        ),
        (
            ["data.prompt_field=p", "data.completion_field=c", "data.packing=concat"],
            "data.packing",
            "data.packing=false",
        ),
    ],
    ids=["documents", "packed_documents", "packed_records"],
)
def test_document_masks_are_refused_with_the_fix_that_removes_them(
    overrides: list[str], key: str, fix: str
) -> None:
    """data=hf documents get masks with data.packing=false too: the Fix names what removes them."""
    error = refusal(["parallel.tp=2", *DOCUMENTS, *overrides])
    assert error.keys == [key, "parallel.tp"]
    assert error.fix.startswith(f"set {fix},")
    fixed = [o for o in overrides if not o.startswith("data.packing")]
    assert not config(["parallel.tp=2", *DOCUMENTS, *fixed, *fix.split()]).data.document_masks
