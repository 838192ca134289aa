"""parallel.pp and parallel.pp_schedule: the world is dp x tp x pp, the stages split the blocks
evenly, the schedule's micro-batches are the accumulation's, and every layout or feature that
does not compose with pipeline parallelism yet is one ConfigError before launch, naming the keys,
whose Fix works as printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose

from launcher.config import to_root_config
from launcher.config.pipeline import bubble
from launcher.config.root import RootConfig
from launcher.config.stages import stage_layout
from launcher.distributed import DistContext
from launcher.errors import ConfigError
from tests.helpers import run_launch

TINY = ["model.n_head=4", "model.d_model=32", "model.seq_len=24", "batch.global_size=8"]


@pytest.fixture(autouse=True)
def _hydra(hydra_conf: None) -> None:
    """Every config here is composed from conf/ with command-line overrides."""


def config(overrides: list[str]) -> RootConfig:
    """The config `launch` would run (the built-in GPT made small unless another model is
    named)."""
    own = any(o.startswith("model=") for o in overrides)
    small = [o for o in TINY if not (own and o.startswith("model."))]
    return to_root_config(compose(config_name="config", overrides=[*small, *overrides]))


def refusal(overrides: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config(overrides)
    return info.value


def test_world_is_dp_times_pp_and_the_stages_split_the_blocks() -> None:
    cfg = config(["parallel.dp=2", "parallel.pp=2", "model.n_layer=4", "batch.grad_accum=2"])
    assert (cfg.parallel.world, cfg.parallel.ranks_per_node, cfg.split().dp) == (4, 4, 2)
    stages = stage_layout(cfg).describe()
    assert [(s["pp_rank"], s["blocks"], s["embedding"], s["head"]) for s in stages] == [
        (0, [0, 1], True, False),
        (1, [2, 3], False, True),
    ]
    assert bubble(2, 4) == pytest.approx(1 / 5)


def test_a_rank_knows_its_pipeline_place_and_only_the_last_stage_counts_tokens() -> None:
    cpu = pytest.importorskip("torch").device("cpu")
    # world 4 = pp 2 x dp 2 (tp 1): pp outermost, so ranks 0-1 hold stage 0, ranks 2-3 stage 1
    places = [DistContext(r, 4, r, cpu, pp=2) for r in range(4)]
    assert [(c.pp_rank, c.dp_rank, c.dp_size) for c in places] == [
        (0, 0, 2),
        (0, 1, 2),
        (1, 0, 2),
        (1, 1, 2),
    ]
    assert [c.counts_tokens for c in places] == [False, False, True, True]


def test_pp_larger_than_the_layers_is_refused_naming_parallel_pp() -> None:
    error = refusal(["parallel.pp=4", "model.n_layer=2", "batch.grad_accum=4"])
    assert error.keys[0] == "parallel.pp"
    assert "n_layer=2" in error.problem
    assert error.fix.startswith("set parallel.pp=2")
    config(["parallel.pp=2", "model.n_layer=2", "batch.grad_accum=4"])  # the fix as printed


def test_interleaved_needs_two_stages_per_rank_of_whole_blocks() -> None:
    interleaved = ["parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b", "batch.grad_accum=2"]
    error = refusal([*interleaved, "model.n_layer=2"])
    assert error.keys[0] == "parallel.pp"
    assert "4 stages (2 per rank)" in error.problem
    assert "model.n_layer=4" in error.fix
    cfg = config([*interleaved, "model.n_layer=4"])  # the fix as printed
    assert [s["pp_rank"] for s in stage_layout(cfg).describe()] == [0, 1, 0, 1]


def test_1f1b_with_fewer_micro_batches_than_stages_is_refused_naming_grad_accum() -> None:
    error = refusal(["parallel.pp=2", "model.n_layer=2", "batch.grad_accum=1"])
    assert error.keys[0] == "batch.grad_accum"
    assert error.fix.startswith("set batch.grad_accum=2")
    config(["parallel.pp=2", "model.n_layer=2", "batch.grad_accum=2"])  # the fix as printed
    config(["parallel.pp=2", "model.n_layer=2", "parallel.pp_schedule=gpipe"])  # any number


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        (["engine=deepspeed"], "engine", "engine=fsdp"),
        (["checkpoint.async=true"], "checkpoint.async", "checkpoint.async=false"),
        (["adapter=lora"], "adapter", "adapter=none"),
        (["train.compile=true"], "train.compile", "train.compile=false"),
        (["ac=selective"], "ac", "ac=full"),
        (["model=hf", "model.config=tests/fixtures/tiny_llama.json"], "model", None),
    ],
    ids=["deepspeed", "async", "lora", "compile", "selective", "hf"],
)
def test_what_does_not_compose_is_refused_naming_the_key(
    overrides: list[str], key: str, fix: str | None
) -> None:
    own = any(o.startswith("model=") for o in overrides)
    base = ["parallel.pp=2", "batch.grad_accum=2", *([] if own else ["model.n_layer=2"])]
    error = refusal([*base, *overrides])
    assert key in error.keys, error.keys
    assert "parallel.pp" in error.keys or key == "parallel.pp_schedule"
    assert error.fix
    if fix is not None:
        assert fix in error.fix
        fixed = [o for o in overrides if o.split("=")[0] != fix.split("=")[0]]
        config([*base, *fixed, fix])  # the fix as printed


def test_an_unknown_schedule_is_refused() -> None:
    error = refusal(["parallel.pp_schedule=zigzag"])
    assert error.keys == ["parallel.pp_schedule"]
    assert "gpipe" in error.fix


def test_launch_plan_names_the_stages_and_plans_a_rank_of_the_pipeline(tmp_path: Path) -> None:
    args = ["plan", "model.n_layer=4", "batch.grad_accum=4", "batch.global_size=8"]
    run_launch([*args, "wandb.mode=disabled"], tmp_path / "whole")
    proc = run_launch([*args, "parallel.pp=2", "wandb.mode=disabled"], tmp_path)
    whole = json.loads((tmp_path / "whole" / "plan.json").read_text())
    plan = json.loads((tmp_path / "plan.json").read_text())
    # a rank holds half the blocks (and the embedding or head): fewer parameter bytes
    parts, whole_parts = plan["memory_plan"]["parts"], whole["memory_plan"]["parts"]
    assert parts["parameters"] < 0.65 * whole_parts["parameters"]
    assert (plan["world_size"], plan["dp"], plan["pp"]) == (2, 1, 2)
    assert plan["pipeline"]["schedule"] == "1f1b"
    assert [s["blocks"] for s in plan["pipeline"]["stages"]] == [[0, 1], [2, 3]]
    assert "pipeline    pp 2, schedule 1f1b, 4 micro-batch(es) per step" in proc.stdout
    assert "stage 0 on pp rank 0: embedding, blocks 0-1" in proc.stdout
    assert "stage 1 on pp rank 1: blocks 2-3, final norm and head" in proc.stdout
